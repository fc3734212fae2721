"""Strings from a target, a file or the environment, made inert before any renderer sees them.

A GPU name, host name, path or error line is data, never terminal control or rich markup: a
target that answers `\\x1b]8;;http://x\\x1b\\\\` (an OSC-8 hyperlink), `\\x1b[2J` (clear screen) or
`[link=...]` must show up as those characters, not act on the reader's terminal, and a host name
`node[/bold]` must not crash the report with a MarkupError. Every renderer (single-target report,
fleet table, progress and error lines) goes through `plain` and prints it as `rich.text.Text` or
with a plain print() (never as a rich string, whose markup, emoji and highlighter passes read
`[...]` and `:name:`), and long strings are cut so that nothing later
(redaction, wrapping) sees more than `MAX_FIELD_CHARS`.
"""

from __future__ import annotations

import re
from typing import Any

# A fact is a version, a path, a name or one error line: 4 KiB is far above any real one, and
# keeps rich's highlighter and text wrapping from taking seconds on a 100 KB "host name".
MAX_FIELD_CHARS = 4096

# C0 controls (tab and newline too: a fact is one line), DEL, C1 controls (0x9b is a one-byte CSI
# on some terminals), and the bidirectional overrides/isolates that reorder what the reader sees.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: Any, limit: int = MAX_FIELD_CHARS, multiline: bool = False) -> str:
    """`value` as one inert line: control characters shown as `\\x1b`-style escapes, cut to
    `limit` characters (with a note of how much was cut). multiline: keep newlines (our own
    multi-line text that embeds facts)."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    text = (_CONTROL_BUT_NEWLINE if multiline else _CONTROL).sub(_visible, text)
    if cut > 0:
        text += f"... [{cut} more characters]"
    return text


def plain_tree(obj: Any, depth: int = 0) -> Any:
    """A copy of a JSON-like tree with every string (keys too) passed through `plain`: what the
    single-target report renders (as rich Text, so no markup is read from it). Deeper than 64
    levels is not a fact; it is shown as '...'."""
    if depth > 64:
        return "..."
    if isinstance(obj, dict):
        return {plain(k) if isinstance(k, str) else k: plain_tree(v, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain_tree(v, depth + 1) for v in obj]
    if isinstance(obj, str):
        return plain(obj)
    return obj


def text(value: Any, style: str = "", limit: int = MAX_FIELD_CHARS) -> Any:
    """A rich Text of `plain(value)`: markup inert by construction."""
    from rich.text import Text

    return Text(plain(value, limit), style=style)
