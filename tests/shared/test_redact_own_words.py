"""Redaction hits secrets, never the tool's own words.

"pass a model directory or --tokenizer DIR" came out as "... --tokenizer <redacted>" (and
"tokenizer: pass" as "tokenizer: <redacted>"): a name was secret when its letters held TOKEN.
Now a name is secret by its words. The planted secrets of test_hostile_secrets.py and
tests/doctor/remote/test_remote_redact.py still go; these check the other side: every message the tool
itself can print through the redactor comes out unchanged, and so does a real usage error.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hostile_fakes import fastpath
from repo_paths import ROOT

from fastpath.shared.redact import REDACTED, is_secret_name, redact_text

SRC = ROOT / "src" / "fastpath"
# Modules whose every string reaches an output that is redacted (doctor reports, fleet tables,
# one-line errors); elsewhere only the messages of raised exceptions do.
REDACTED_OUTPUT_MODULES = ("doctor", "cli.py", "shared/model_source.py", "shared/extras.py", "shared/known_issues.py")


def _text(node: ast.AST) -> str | None:
    """A string literal, or an f-string with each placeholder as 'X'."""
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _own_messages() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstring_ids(tree)
        every_string = rel.parts[0] in REDACTED_OUTPUT_MODULES
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                candidates = list(ast.walk(node.exc))
            elif every_string:
                candidates = [node]
            else:
                continue
            for cand in candidates:
                text = _text(cand)
                if text and id(cand) not in skip:
                    found.append((str(rel), getattr(cand, "lineno", 0), text))
    return found


def test_the_tools_own_messages_pass_the_redactor_unchanged() -> None:
    messages = _own_messages()
    assert len(messages) > 300  # the sweep really read the source
    mangled = [(f, line, text, redact_text(text)) for f, line, text in messages
               if redact_text(text) != text]
    assert not mangled, mangled[:10]


@pytest.mark.parametrize("text", [
    "chat rows need a tokenizer: pass a model directory or --tokenizer DIR",
    "use --tokenizer=./tok", "tokenizer_config.json: missing", "keyboard: us",
    "passthrough: on", "author: someone", "max_tokens=5", "expected key=value, got x",
    "KeyError: 'gpus'", "ssh -o StrictHostKeyChecking=no -o PasswordAuthentication=no gpu1",
])
def test_words_that_contain_a_secret_part_stay(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("--api-key SEKRET1", "SEKRET1"), ("--token SEKRET2", "SEKRET2"),
    ("--passphrase=SEKRET3", "SEKRET3"), ("apiKey: SEKRET4", "SEKRET4"),
    ("HFToken=SEKRET5", "SEKRET5"), ("SSHPASS=SEKRET6", "SEKRET6"), ("API_KEYS=SEKRET7", "SEKRET7"),
    ("GOOGLE_APPLICATION_CREDENTIALS=/SEKRET8", "SEKRET8"), ("tokenizer: x HF_TOKEN=SEKRET9", "SEKRET9"),
    ('{"db_password": "SEKRET10"}', "SEKRET10"), ("--db-pwd SEKRET11", "SEKRET11"),
])
def test_secrets_named_by_a_word_still_go(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out, out


def test_name_words() -> None:
    for name in ("HF_TOKEN", "apiKey", "api-token", "MYSQL_PWD", "sshpass", "GITHUB_PAT_SECRET",
                 "Authorization", "clientSecret"):
        assert is_secret_name(name), name
    for name in ("tokenizer", "keyboard", "passthrough", "author", "max_tokens", "tokenize_chat",
                 "PasswordAuthentication"):
        assert not is_secret_name(name), name


def test_a_real_usage_error_reads_whole(tmp_path: Path) -> None:
    """The capture of chat rows without a tokenizer: one line, exit 2, every word as written."""
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "yo"}]}) + "\n")
    proc = fastpath("capture", "lfm2-1.2b", str(data), "--out", str(tmp_path / "hs"), timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err[-2000:]
    assert "chat rows need a tokenizer: pass a model directory or --tokenizer DIR" in err, err
    assert REDACTED not in err
