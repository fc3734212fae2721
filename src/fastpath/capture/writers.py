"""One writer per offline layout. Every file is written to a temporary name in its final
directory and renamed into place, so a file that exists is complete: a killed run leaves only
whole rows, and `--resume` trusts existence (and re-reads the last rows to be sure).

speculators (read by `ArrowDataset` in src/speculators/train/data.py; its data generator writes
the same files, scripts/data_generation_offline.py):
    DIR/                         `datasets.save_to_disk` of input_ids, loss_mask (int64 lists),
                                 seq_len, format "torch" (as prepare_data.py saves it)
    DIR/hidden_states/hs_{i}.safetensors   hidden_states [seq, K+1, H] in the model dtype
                                 (layers in id order, last slot = last layer's output before the
                                 final norm), token_ids [seq] int64 == input_ids of row i
SpecForge (written by scripts/prepare_hidden_states.py, read by OfflineEagle3Dataset in
specforge/data/preprocessing.py):
    DIR/rows_{g}-{g+2000}/data_{i}.ckpt    torch.save of input_ids [seq], loss_mask [seq] (int64),
                                 aux_hidden_state [1, seq, K*H] (layers concatenated in id order),
                                 hidden_state [1, seq, H] (after the final norm)
Both: DIR/token_freq.pt (token id -> count over loss-masked positions, as speculators'
save_token_frequency_distribution writes it), DIR/capture_summary.json.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fastpath.shared.errors import UsageError

SPECFORGE_GROUP = 2000  # rows per rows_{g}-{g+2000} folder (SpecForge's default file_group_size)
SUMMARY_NAME = "capture_summary.json"
SHARD_META_NAME = "fastpath_capture.json"  # per SpecForge rows_ folder (not a .ckpt: its loader skips it)


def need(module: str) -> Any:
    """Import an optional dependency of `fastpath capture`, or say which pip install brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        from fastpath.shared.extras import install_line

        raise UsageError(f"fastpath capture needs {module.split('.')[0]}: {install_line('capture')}") from None


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) then rename tmp -> path (same directory, so the rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def remove_stale_temps(out: Path) -> int:
    """Delete the temporary files and folders (`.NAME.tmpPID`, `.index.tmpPID`) a killed run
    left in `out`; returns how many. Only for a resume, before any process writes."""
    import shutil

    count = 0
    for path in list(out.rglob(".*.tmp*")):
        if not path.name.rsplit(".tmp", 1)[-1].isdigit():
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        count += 1
    return count


def atomic_json(path: Path, data: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def token_freq(rows: Iterable[tuple[list[int], list[int]]]) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for ids, mask in rows:
        counts.update(t for t, m in zip(ids, mask, strict=True) if m)
    return {t: counts[t] for t in sorted(counts)}


class Writer:
    """Common face: where a row's files go, writing and reading them, the dataset index. Each
    layout's name, client and rules are its format's (capture.formats)."""

    ids_key = ""  # the row file's token-id tensor
    needs_pre = False  # stores the last layer's output before the final norm
    needs_post = False  # stores the final norm's output

    def __init__(self, out: Path) -> None:
        self.out = out

    def row_paths(self, idx: int) -> list[Path]:
        raise NotImplementedError

    def is_done(self, idx: int) -> bool:
        return all(p.exists() for p in self.row_paths(idx))

    def layout(self, aux: Sequence[Any], pre: Any, post: Any) -> list[Any]:
        """A row's stored tensors, built from its states ([T, H] each; pre/post None unless
        needs_pre/needs_post) on whatever device they are: the stack or concat runs there."""
        raise NotImplementedError

    def write_row(self, idx: int, ids: Any, mask: Any, stored: Sequence[Any], meta: dict[str, str]) -> None:
        """Write row idx from `layout`'s tensors (on the host, contiguous, each its own storage)."""
        raise NotImplementedError

    def read_row(self, idx: int) -> dict[str, Any]:
        raise NotImplementedError

    def row_ids(self, idx: int) -> list[int]:
        """The token ids row idx's file holds."""
        return self.read_row(idx)[self.ids_key].tolist()

    def layout_problems(self, idx: int, ids: list[int], mask: list[int], num_aux: int, hidden: int,
                        dtype: Any) -> list[str]:
        """Read row idx back and check it by the layout's own rules."""
        raise NotImplementedError

    def stored_states(self, idx: int, num_aux: int) -> dict[str, Any]:
        """The row's stored hidden states by name ([seq, H] each), for the tensor checks."""
        raise NotImplementedError

    def write_index(self, rows: list[tuple[list[int], list[int]]], meta: dict[str, Any]) -> None:
        atomic_write(self.out / "token_freq.pt", lambda tmp: _torch_save(token_freq(rows), tmp))


def _torch_save(obj: Any, path: Path) -> None:
    import torch

    torch.save(obj, path)


def _check(problems: list[str], ok: bool, text: str) -> None:
    if not ok:
        problems.append(text)


class SpeculatorsWriter(Writer):
    ids_key = "token_ids"
    needs_pre = True

    def row_paths(self, idx: int) -> list[Path]:
        return [self.out / "hidden_states" / f"hs_{idx}.safetensors"]

    def layout(self, aux: Sequence[Any], pre: Any, post: Any) -> list[Any]:
        import torch

        return [torch.stack([*aux, pre], dim=1)]

    def write_row(self, idx: int, ids: Any, mask: Any, stored: Sequence[Any], meta: dict[str, str]) -> None:
        st = need("safetensors.torch")
        tensors = {"hidden_states": stored[0].contiguous(), "token_ids": ids.contiguous()}
        atomic_write(self.row_paths(idx)[0], lambda tmp: st.save_file(tensors, str(tmp), metadata=meta))

    def read_row(self, idx: int) -> dict[str, Any]:
        st = need("safetensors.torch")
        return st.load_file(str(self.row_paths(idx)[0]))

    def layout_problems(self, idx: int, ids: list[int], mask: list[int], num_aux: int, hidden: int,
                        dtype: Any) -> list[str]:
        problems: list[str] = []
        try:
            data = self.read_row(idx)
        except Exception as exc:
            return [f"row {idx}: cannot read {self.row_paths(idx)[0].name}: {exc}"]
        _check(problems, set(data) == {"hidden_states", "token_ids"}, f"row {idx}: keys {sorted(data)}")
        if problems:
            return problems
        hs, tok = data["hidden_states"], data["token_ids"]
        _check(problems, tuple(hs.shape) == (len(ids), num_aux + 1, hidden),
               f"row {idx}: hidden_states shape {tuple(hs.shape)}, expected {(len(ids), num_aux + 1, hidden)}")
        _check(problems, hs.dtype == dtype, f"row {idx}: hidden_states dtype {hs.dtype}, expected {dtype}")
        _check(problems, tok.tolist() == list(ids), f"row {idx}: token_ids differ from input_ids")
        return problems

    def stored_states(self, idx: int, num_aux: int) -> dict[str, Any]:
        hs = self.read_row(idx)["hidden_states"]
        return {f"slot {k}": hs[:, k] for k in range(hs.shape[1])}

    def write_index(self, rows: list[tuple[list[int], list[int]]], meta: dict[str, Any]) -> None:
        """The arrow dataset, saved beside a temporary folder and moved in file by file."""
        import shutil

        datasets = need("datasets")
        datasets.disable_progress_bars()
        super().write_index(rows, meta)
        features = datasets.Features({
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "loss_mask": datasets.Sequence(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
        })
        ds = datasets.Dataset.from_dict(
            {"input_ids": [list(r[0]) for r in rows], "loss_mask": [list(r[1]) for r in rows],
             "seq_len": [len(r[0]) for r in rows]},
            features=features,
        )
        ds.set_format(type="torch")
        tmp = self.out / f".index.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            ds.save_to_disk(str(tmp))
            for old in self.out.glob("data-*.arrow"):
                old.unlink()
            names = sorted(p.name for p in tmp.iterdir())
            for name in names:  # state.json last: it names the arrow files
                if name != "state.json":
                    os.replace(tmp / name, self.out / name)
            os.replace(tmp / "state.json", self.out / "state.json")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class SpecForgeWriter(Writer):
    ids_key = "input_ids"
    needs_post = True

    @staticmethod
    def group_dir(idx: int) -> str:
        g = (idx // SPECFORGE_GROUP) * SPECFORGE_GROUP
        return f"rows_{g}-{g + SPECFORGE_GROUP}"

    def row_paths(self, idx: int) -> list[Path]:
        return [self.out / self.group_dir(idx) / f"data_{idx}.ckpt"]

    def layout(self, aux: Sequence[Any], pre: Any, post: Any) -> list[Any]:
        import torch

        return [torch.cat(list(aux), dim=-1), post]

    def write_row(self, idx: int, ids: Any, mask: Any, stored: Sequence[Any], meta: dict[str, str]) -> None:
        record = {
            "input_ids": ids.contiguous(),
            "loss_mask": mask.contiguous(),
            "aux_hidden_state": stored[0].unsqueeze(0).contiguous(),
            "hidden_state": stored[1].unsqueeze(0).contiguous(),
        }
        atomic_write(self.row_paths(idx)[0], lambda tmp: _torch_save(record, tmp))

    def read_row(self, idx: int) -> dict[str, Any]:
        import torch

        return torch.load(self.row_paths(idx)[0], weights_only=True)

    def layout_problems(self, idx: int, ids: list[int], mask: list[int], num_aux: int, hidden: int,
                        dtype: Any) -> list[str]:
        import torch

        problems: list[str] = []
        try:
            data = self.read_row(idx)
        except Exception as exc:
            return [f"row {idx}: cannot read {self.row_paths(idx)[0].name}: {exc}"]
        want = {"input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
        _check(problems, set(data) == want, f"row {idx}: keys {sorted(data)}")
        if problems:
            return problems
        seq = len(ids)
        _check(problems, data["input_ids"].dtype == torch.int64 and data["input_ids"].tolist() == list(ids),
               f"row {idx}: input_ids differ")
        _check(problems, data["loss_mask"].tolist() == list(mask), f"row {idx}: loss_mask differs")
        _check(problems, tuple(data["aux_hidden_state"].shape) == (1, seq, num_aux * hidden),
               f"row {idx}: aux_hidden_state shape {tuple(data['aux_hidden_state'].shape)}")
        _check(problems, tuple(data["hidden_state"].shape) == (1, seq, hidden),
               f"row {idx}: hidden_state shape {tuple(data['hidden_state'].shape)}")
        for key in ("aux_hidden_state", "hidden_state"):
            _check(problems, data[key].dtype == dtype, f"row {idx}: {key} dtype {data[key].dtype}, expected {dtype}")
        return problems

    def stored_states(self, idx: int, num_aux: int) -> dict[str, Any]:
        data = self.read_row(idx)
        aux = data["aux_hidden_state"][0]
        hidden = data["hidden_state"].shape[-1]
        out = {f"aux {k}": aux[:, k * hidden:(k + 1) * hidden] for k in range(num_aux)}
        out["final (post-norm)"] = data["hidden_state"][0]
        return out

    def write_index(self, rows: list[tuple[list[int], list[int]]], meta: dict[str, Any]) -> None:
        super().write_index(rows, meta)
        for g in range(0, len(rows), SPECFORGE_GROUP):
            folder = self.out / self.group_dir(g)
            if folder.is_dir():
                atomic_json(folder / SHARD_META_NAME, {**meta, "rows": [g, min(g + SPECFORGE_GROUP, len(rows))]})
