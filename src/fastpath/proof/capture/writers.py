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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fastpath.errors import UsageError

FORMATS = ("speculators", "specforge")
SPECFORGE_GROUP = 2000  # rows per rows_{g}-{g+2000} folder (SpecForge's default file_group_size)
SUMMARY_NAME = "capture_summary.json"
SHARD_META_NAME = "fastpath_capture.json"  # per SpecForge rows_ folder (not a .ckpt: its loader skips it)


def need(module: str) -> Any:
    """Import an optional dependency of `fastpath capture`, or say which pip install brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"fastpath capture needs {module.split('.')[0]}: pip install 'fastpath-kit[capture]'") from None


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


def atomic_json(path: Path, data: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


class BackgroundWrites:
    """Row files written by a few threads while the GPU runs the next batch (at ~40 KB per token
    for 4 states of a 5120-wide model, writing is as slow as the forward itself).

    At most `max_pending` rows in flight; `wait()` returns when every submitted row is on disk and
    re-raises the first failure as a FastpathError naming the row.
    """

    def __init__(self, threads: int = 4, max_pending: int = 16) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fastpath-capture-write")
        self.pending: list[tuple[int, Any]] = []
        self.max_pending = max_pending

    def submit(self, idx: int, fn: Callable[[], None]) -> None:
        while len(self.pending) >= self.max_pending:
            self._collect(*self.pending.pop(0))
        self.pending.append((idx, self.pool.submit(fn)))

    def wait(self) -> None:
        while self.pending:
            self._collect(*self.pending.pop(0))

    def close(self) -> None:
        """Finish what was submitted (whole rows only), then stop the threads."""
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)

    @staticmethod
    def _collect(idx: int, future: Any) -> None:
        from fastpath.errors import FastpathError

        try:
            future.result()
        except OSError as exc:
            raise FastpathError(f"writing row {idx} failed: {exc.strerror or exc}") from None
        except Exception as exc:  # a serializer's own error: one line, with the row
            raise FastpathError(f"writing row {idx} failed: {exc.__class__.__name__}: {exc}") from None


def token_freq(rows: Iterable[tuple[list[int], list[int]]]) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for ids, mask in rows:
        counts.update(t for t, m in zip(ids, mask, strict=True) if m)
    return {t: counts[t] for t in sorted(counts)}


class Writer:
    """Common face: where a row's files go, writing and reading them, the dataset index."""

    name = ""
    needs_pre = False  # stores the last layer's output before the final norm
    needs_post = False  # stores the final norm's output

    def __init__(self, out: Path) -> None:
        self.out = out

    def row_paths(self, idx: int) -> list[Path]:
        raise NotImplementedError

    def is_done(self, idx: int) -> bool:
        return all(p.exists() for p in self.row_paths(idx))

    def write_row(self, idx: int, ids: Any, mask: Any, aux: list[Any], pre: Any, post: Any,
                  meta: dict[str, str]) -> None:
        raise NotImplementedError

    def read_row(self, idx: int) -> dict[str, Any]:
        raise NotImplementedError

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
    name = "speculators"
    needs_pre = True

    def row_paths(self, idx: int) -> list[Path]:
        return [self.out / "hidden_states" / f"hs_{idx}.safetensors"]

    def write_row(self, idx: int, ids: Any, mask: Any, aux: list[Any], pre: Any, post: Any,
                  meta: dict[str, str]) -> None:
        import torch

        st = need("safetensors.torch")
        tensors = {"hidden_states": torch.stack([*aux, pre], dim=1).contiguous(), "token_ids": ids.contiguous()}
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
    name = "specforge"
    needs_post = True

    @staticmethod
    def group_dir(idx: int) -> str:
        g = (idx // SPECFORGE_GROUP) * SPECFORGE_GROUP
        return f"rows_{g}-{g + SPECFORGE_GROUP}"

    def row_paths(self, idx: int) -> list[Path]:
        return [self.out / self.group_dir(idx) / f"data_{idx}.ckpt"]

    def write_row(self, idx: int, ids: Any, mask: Any, aux: list[Any], pre: Any, post: Any,
                  meta: dict[str, str]) -> None:
        import torch

        record = {
            "input_ids": ids.contiguous(),
            "loss_mask": mask.contiguous(),
            "aux_hidden_state": torch.cat(aux, dim=-1).unsqueeze(0).contiguous(),
            "hidden_state": post.unsqueeze(0).contiguous(),
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


def make_writer(fmt: str, out: Path) -> Writer:
    if fmt == "speculators":
        need("safetensors.torch")
        need("datasets")
        return SpeculatorsWriter(out)
    if fmt == "specforge":
        return SpecForgeWriter(out)
    raise UsageError(f"unknown --format {fmt!r}; use {' or '.join(FORMATS)}")
