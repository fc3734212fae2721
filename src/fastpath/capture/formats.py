"""Capture's offline layouts, one class each: the name `--format` and `--check-client` take, the
writer of its row and index files, the dtypes its client can read, how to install that client
beside (never into) this Python, how to check what the client trains against, and the notes a
capture says about it.

Why classes: the CLI's choices, the writers, the capture run and the client checks all go through
FORMATS, so a layout is described in one place and nothing else compares format names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from fastpath.capture.clients import (
    ZERO_CENTRED,
    ClientResult,
    specforge_index_note,
    specforge_results,
    speculators_results,
)
from fastpath.capture.writers import SpecForgeWriter, SpeculatorsWriter, Writer, need
from fastpath.shared.errors import UsageError


class CaptureFormat:
    """One offline layout and the drafter-training client that reads it."""

    name: ClassVar[str]  # the layout's and its client's name (also the client's package)
    writer_class: ClassVar[type[Writer]]
    # What `pip install CLIENT` would do to this Python (the client's own metadata, Requires-Dist),
    # and the install line for a side venv that sees this Python's packages instead.
    client_pins: ClassVar[str]
    client_install: ClassVar[str]
    # Run the client's check after a capture without --check-client when the client is importable;
    # when it is not, the note says why the check matters (`unasked_why`).
    checked_unasked: ClassVar[bool] = False
    unasked_why: ClassVar[str] = ""

    def check_dtype(self, dtype: str) -> None:
        """UsageError (one line, before anything loads) when the client cannot read `dtype` states."""

    def make_writer(self, out: Path) -> Writer:
        return self.writer_class(out)

    def capture_note(self, model_dir: Path | None) -> str | None:
        """A line a capture without --check-client says about MODEL for this client, or None."""
        return None

    def client_results(self, verifier: Path, out: Path, rows: list[int], targets: dict[int, Any], *,
                       writer: Writer, aux_ids: list[int], convention: str, eps: float,
                       target_kind: str) -> list[ClientResult]:
        """The client's own code on `rows` of the capture in `out`, its target weights read from
        `verifier` (MODEL, or the client target: `target_kind`), against `targets` (ids, logits)."""
        raise NotImplementedError

    def client_target_norm(self, model: Any, convention: str) -> Any | None:
        """The final-norm weight a --client-target directory stores for this client, or None to
        keep MODEL's own."""
        return None


class SpeculatorsFormat(CaptureFormat):
    name = "speculators"
    writer_class = SpeculatorsWriter
    client_pins = "speculators 0.9.0 requires transformers<=5.19.0"  # and torch<=2.14.1, torchvision, torchaudio
    client_install = "pip install speculators"
    checked_unasked = True  # a user who does not know its norm bug will not ask for the check
    unasked_why = "speculators <= 0.9.0 trains EAGLE-3 against the wrong final norm for Qwen3.5 / Qwen3-Next"

    def make_writer(self, out: Path) -> Writer:
        need("safetensors.torch")
        need("datasets")
        return super().make_writer(out)

    def client_results(self, verifier: Path, out: Path, rows: list[int], targets: dict[int, Any], *,
                       writer: Writer, aux_ids: list[int], convention: str, eps: float,
                       target_kind: str) -> list[ClientResult]:
        return speculators_results(verifier, out, rows, targets, aux_ids, convention, eps, target_kind)

    def client_target_norm(self, model: Any, convention: str) -> Any | None:
        """1 + w for a zero-centred final norm: the client's x̂·w verifier norm then computes the
        target's x̂·(1 + w) (capture.clients' module doc)."""
        from fastpath.capture.layers import decoder_parts

        if convention != ZERO_CENTRED:
            return None
        return 1.0 + decoder_parts(model).norm.weight.detach().float()


class SpecForgeFormat(CaptureFormat):
    name = "specforge"
    writer_class = SpecForgeWriter
    client_pins = "specforge 0.2.0 requires torch==2.11.0 and transformers==5.8.1"
    # Its readers and TargetHead import none of its pinned stack (scripts/setup_clients.sh).
    client_install = ("pip install --no-deps specforge && ~/.venvs/specforge/bin/pip install datasets "
                      "pydantic tqdm pyyaml psutil")

    def check_dtype(self, dtype: str) -> None:
        from fastpath.models.dtypes import dtype_label, torch_dtype

        if dtype_label(torch_dtype(dtype)) != "bf16":
            raise UsageError(f"--format {self.name} needs --dtype bf16: SpecForge casts its target head to bf16 "
                             f"and cannot read {dtype} states (specforge/modeling/target/target_head.py)")

    def capture_note(self, model_dir: Path | None) -> str | None:
        return specforge_index_note(model_dir)

    def client_results(self, verifier: Path, out: Path, rows: list[int], targets: dict[int, Any], *,
                       writer: Writer, aux_ids: list[int], convention: str, eps: float,
                       target_kind: str) -> list[ClientResult]:
        return specforge_results(verifier, out, rows, targets, lambda idx: writer.row_paths(idx)[0])


FORMATS: dict[str, CaptureFormat] = {fmt.name: fmt for fmt in (SpeculatorsFormat(), SpecForgeFormat())}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)  # the CLI's choices for --format and --check-client
DEFAULT_FORMAT = SpeculatorsFormat.name


def capture_format(name: str) -> CaptureFormat:
    """The format called `name`; a one-line UsageError naming the choices for any other."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise UsageError(f"unknown --format {name!r}; use {' or '.join(FORMAT_NAMES)}")
    return fmt


def format_of(writer: Writer) -> CaptureFormat:
    """The format whose files `writer` writes."""
    return next(fmt for fmt in FORMATS.values() if isinstance(writer, fmt.writer_class))
