"""DATA -> token rows: JSONL in the common chat forms, rendered with the tokenizer's chat
template, with a loss mask over the assistant's turns; or rows that already carry
`input_ids` and `loss_mask`.

Accepted lines (one JSON object each):
- `{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}`
- ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}`
- `{"input_ids": [...], "loss_mask": [...]}` (no tokenizer needed)

The loss mask covers what the assistant writes, including the template's end-of-turn tokens,
because a drafter must also learn to predict the end of a turn. It is found by rendering each
prefix of the conversation: the assistant's span of turn k runs from the end of
render(messages[:k], add_generation_prompt=True) to the end of render(messages[:k+1]). Templates
that rewrite earlier turns (dropping old reasoning) break that prefix property; then the span is
the assistant's content, found in order in the full rendering.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.shared.errors import UsageError, first_line

# ShareGPT speaker names -> chat roles.
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system", "tool": "tool",
    "function": "tool", "observation": "tool",
}


@dataclass(frozen=True)
class TokenRow:
    """One training sequence: ids and a 0/1 mask of the positions a drafter is trained on."""

    input_ids: list[int]
    loss_mask: list[int]
    line: int  # 1-based line in DATA it came from


@dataclass
class LoadedData:
    rows: list[TokenRow]
    skipped: dict[str, list[int]] = field(default_factory=dict)  # reason -> line numbers
    truncated: int = 0


def load_tokenizer(path: str | Path) -> Any:
    """A fast tokenizer from a local directory (never the hub); UsageError when there is none."""
    from fastpath.models.resolve import quiet_hub_environment

    quiet_hub_environment()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"no tokenizer in {path}: {first_line(exc)}") from None
    if not getattr(tok, "is_fast", False):
        raise UsageError(f"the tokenizer in {path} is not a fast tokenizer (offsets are needed for loss masks)")
    return tok


def messages_of(obj: dict[str, Any], line: int) -> list[dict[str, str]] | None:
    """The conversation of a JSONL object as role/content messages (None if it has none)."""
    if isinstance(obj.get("messages"), list):
        out = []
        for m in obj["messages"]:
            if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
                raise UsageError(f"line {line}: each message needs a role and a string content")
            out.append({"role": str(m["role"]), "content": m["content"]})
        return out
    if isinstance(obj.get("conversations"), list):
        out = []
        for m in obj["conversations"]:
            if not isinstance(m, dict) or not isinstance(m.get("value"), str) or "from" not in m:
                raise UsageError(f"line {line}: each ShareGPT turn needs 'from' and a string 'value'")
            role = SHAREGPT_ROLES.get(str(m["from"]).lower())
            if role is None:
                raise UsageError(f"line {line}: unknown ShareGPT speaker {m['from']!r}")
            out.append({"role": role, "content": m["value"]})
        return out
    return None


def _render(tok: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tok: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans the loss mask covers (module doc)."""
    text = _render(tok, messages, False)
    spans: list[tuple[int, int]] = []
    prefix_ok = True
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = _render(tok, messages[:k], True) if k else ""
        after = _render(tok, messages[: k + 1], False)
        if not (text.startswith(after) and after.startswith(before) and len(after) > len(before)):
            prefix_ok = False
            break
        spans.append((len(before), len(after)))
    if prefix_ok:
        return text, spans
    spans, cursor = [], 0
    for msg in messages:
        if msg["role"] != "assistant" or not msg["content"]:
            continue
        start = text.find(msg["content"], cursor)
        if start < 0:
            continue
        spans.append((start, start + len(msg["content"])))
        cursor = start + len(msg["content"])
    return text, spans


def tokenize_chat(tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and the assistant-only loss mask."""
    text, spans = assistant_spans(tok, messages)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = []
    for start, end in enc["offset_mapping"]:
        inside = end > start and any(start < s_end and end > s_start for s_start, s_end in spans)
        mask.append(1 if inside else 0)
    return ids, mask


def _int_list(value: Any, name: str, line: int) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise UsageError(f"line {line}: {name} must be a list of integers")
    return list(value)


def load_rows(path: str | Path, tokenizer: Any | None, max_len: int, vocab_size: int) -> LoadedData:
    """Read DATA into token rows, truncated to max_len; rows with nothing to train on are skipped
    (and reported), because a drafter learns nothing from them."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"data file {path} does not exist")
    out = LoadedData(rows=[])
    with path.open("r", encoding="utf-8") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{line_no}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise UsageError(f"{path}:{line_no}: each line must be a JSON object")
            if "input_ids" in obj:
                ids = _int_list(obj["input_ids"], "input_ids", line_no)
                mask = _int_list(obj.get("loss_mask", [1] * len(ids)), "loss_mask", line_no)
                if len(mask) != len(ids):
                    raise UsageError(f"{path}:{line_no}: loss_mask has {len(mask)} entries, input_ids {len(ids)}")
                if any(m not in (0, 1) for m in mask):
                    raise UsageError(f"{path}:{line_no}: loss_mask must hold only 0 and 1")
            else:
                messages = messages_of(obj, line_no)
                if messages is None:
                    raise UsageError(f"{path}:{line_no}: expected 'messages', 'conversations' or 'input_ids'")
                if tokenizer is None:
                    raise UsageError("chat rows need a tokenizer: pass a model directory or --tokenizer DIR")
                try:
                    ids, mask = tokenize_chat(tokenizer, messages)
                except UsageError:
                    raise
                except Exception as exc:  # a template that rejects the conversation
                    raise UsageError(f"{path}:{line_no}: chat template failed: {first_line(exc)}") from None
            if any(i < 0 or i >= vocab_size for i in ids):
                raise UsageError(f"{path}:{line_no}: token id outside the model's vocabulary (0..{vocab_size - 1})")
            if len(ids) > max_len:
                ids, mask = ids[:max_len], mask[:max_len]
                out.truncated += 1
            if len(ids) < 2:
                out.skipped.setdefault("shorter than 2 tokens", []).append(line_no)
                continue
            if not any(mask):
                out.skipped.setdefault("no loss-masked tokens", []).append(line_no)
                continue
            out.rows.append(TokenRow(ids, mask, line_no))
    if not out.rows:
        raise UsageError(f"{path}: no usable rows (skipped: {sum(len(v) for v in out.skipped.values())})")
    return out


def file_sha256(path: str | Path) -> str:
    """Content hash of DATA: a resume against an edited file would pair rows with the wrong files."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
