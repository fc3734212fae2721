"""Redaction of secrets in facts and rendered text, by variable name and by shape.

The probe redacts on the target already; this is the second line of defence, applied to every
facts dict a target sends back and to every output path (text report, JSON, progress, error lines,
fleet table), because a report is the kind of thing people paste into issues and chat. Shapes
covered: `NAME=value` / `"NAME": "value"` where NAME holds PASS, PWD, TOKEN, SECRET, KEY, AUTH or
CREDENTIAL; password flags (`sshpass -p X`, `--password X`, `--token=X`); URL userinfo
(`ssh://root:X@host`); `Authorization: Basic X` and `Bearer X`.

A name is secret by its *words*, not its letters: `HF_TOKEN`, `apiKey`, `--api-token`, `MYSQL_PWD`,
`sshpass` name a secret; `--tokenizer`, `keyboard`, `passthrough`, `author` are ordinary words
that merely contain one (a usage error "pass a model directory or --tokenizer DIR" once came out
as "<redacted>"). The words of a name are its `_`/`-`/`.`/camelCase pieces; a piece is secret
when it is a secret word (token, secret, pass, pwd, key, auth, credential and the spellings in
_SECRET_WORDS) or ends with one (`apikey`, `hfpass`). The plurals `tokens` and `keys` count only
in an upper-case name (`API_KEYS`): in lower case they are counts and lists (`max_tokens`).

Every pattern is linear in its input: a name may only start where a name-character run starts
(a lookbehind), and quoted values stop at their quote or the end of the line, so `"a-" * 8000` or a
100 KB host name cost milliseconds, not the seconds per KB a lazily-scanned name did.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

# Substrings of a variable name that mark its value as secret (matched case-insensitively).
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASS", "PWD", "KEY", "AUTH", "CREDENTIAL")

_PARTS_LOWER = tuple(part.lower() for part in SECRET_NAME_PARTS)
# Whole words (lower case) that hold a secret besides the parts themselves.
_SECRET_WORDS = frozenset((
    "password", "passwd", "passphrase", "passcode", "passwords", "secrets", "credentials",
    "creds", "authorization",
))
# Values that are the tool's own metavariables (`expected key=value`), never a secret.
_PLACEHOLDERS = frozenset(("value", "VALUE", "..."))
# Plurals that are secret in an environment-style (upper-case) name only.
_UPPER_PLURALS = frozenset(("tokens", "keys"))
# The words of a name: `_`, `-`, `.` and whitespace split; camelCase humps split (HostKey -> Host,
# Key; HFToken -> HF, Token); digits stay with their word.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+|[0-9]+")

# Option names that match a part above but hold no secret (OpenSSH options show up in target
# prefixes; `-o PasswordAuthentication=no` says how to log in, not with what).
_NOT_SECRET = frozenset(
    name.lower()
    for name in (
        "StrictHostKeyChecking", "HostKeyAlgorithms", "HostKeyAlias", "HostbasedAcceptedAlgorithms",
        "PubkeyAuthentication", "PubkeyAcceptedAlgorithms", "PubkeyAcceptedKeyTypes",
        "UpdateHostKeys", "VerifyHostKeyDNS", "AddKeysToAgent", "RevokedHostKeys",
        "KbdInteractiveAuthentication", "KbdInteractiveDevices", "HostKey",
        "PasswordAuthentication", "GSSAPIAuthentication", "HostbasedAuthentication",
        "ChallengeResponseAuthentication", "PreferredAuthentications", "NumberOfPasswordPrompts",
        "IdentitiesOnly", "ForwardAgent", "KexAlgorithms", "CASignatureAlgorithms",
        "PKCS11Provider", "SecurityKeyProvider", "FingerprintHash", "PermitLocalCommand",
    )
)

_NAME_CHARS = "A-Za-z0-9_.-"
# NAME= / NAME: / "NAME": / 'NAME'= (the value is read by _VALUE after a secret name). The name
# starts only where a run of name characters starts (no re-scan from every character of a long
# word), and values are not consumed here, so `note: TOKEN=x` still finds TOKEN.
_NAME_SEP = re.compile(
    rf"""(?<![{_NAME_CHARS}])(?P<name>[{_NAME_CHARS}]+)(?P<q1>["']?)[ \t]*[:=][ \t]*"""
)
_VALUE = re.compile(r""""(?P<dq>[^"\n]*)"?|'(?P<sq>[^'\n]*)'?|(?P<val>[^\s,;}\]"']+)""")
# sshpass -p X / -pX (after any other sshpass options).
_SSHPASS = re.compile(r"(?<![\w-])(?P<head>sshpass(?:[ \t]+-[A-OQ-Za-z]\S*)*[ \t]+-p[ \t]*)(?P<val>[^\s\"']+)")
# --password X, --db-token=X, --api-key X (long options whose name is_secret_name; not --tokenizer).
_LONG_FLAG = re.compile(
    r"(?<![\w-])(?P<head>--(?P<name>[A-Za-z0-9_-]+)(?:=|[ \t]+))(?P<val>[^\s\"'-][^\s\"']*)"
)
# scheme://user:password@host
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:\"']*:)(?P<val>[^\s/@\"']+)@"
)
# Authorization: Basic X / Bearer X / Token X ; and a bare `Bearer X`.
_AUTH_HEADER = re.compile(
    r"(?P<head>(?<![\w-])(?:proxy-)?authorization[ \t]*[:=][ \t]*(?:[A-Za-z]+[ \t]+)?)(?P<val>[^\s\"',;]+)"
    r"|(?P<head2>(?<![\w-])bearer[ \t]+)(?P<val2>[^\s\"',;]+)",
    re.IGNORECASE,
)


def _is_secret_word(word: str) -> bool:
    low = word.lower()
    if low in _SECRET_WORDS or low.endswith(_PARTS_LOWER):
        return True
    return low in _UPPER_PLURALS and word.isupper()


def is_secret_name(name: str) -> bool:
    """True when a variable name names a secret (HF_TOKEN, MYSQL_PWD, apiKey, --api-token), not
    when a word of it only contains one (--tokenizer, keyboard, passthrough)."""
    if name.lower() in _NOT_SECRET:
        return False
    return any(_is_secret_word(word) for word in _WORD.findall(name))


def _redact_assignments(text: str) -> str:
    out: list[str] = []
    pos = 0
    for match in _NAME_SEP.finditer(text):
        name = match.group("name")
        if match.start() < pos or not is_secret_name(name) or name.endswith(("Error", "Exception")):
            continue
        value = _VALUE.match(text, match.end())
        if value is None:
            continue
        if value.group("dq") is not None:
            new = f'"{REDACTED}"'
        elif value.group("sq") is not None:
            new = f"'{REDACTED}'"
        elif value.group("val").startswith(REDACTED) or value.group("val") in _PLACEHOLDERS:
            continue
        else:
            new = REDACTED
        out += [text[pos:match.end()], new]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _keep_head(match: re.Match[str]) -> str:
    if match.group("val") == REDACTED:
        return match.group(0)
    return match.group("head") + REDACTED


def _secret_flag(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("name")):
        return match.group(0)
    return _keep_head(match)


def _auth(match: re.Match[str]) -> str:
    if match.group("head") is not None:
        return match.group("head") + REDACTED
    return match.group("head2") + REDACTED


def redact_text(text: str) -> str:
    """`text` with every secret-shaped value replaced by `<redacted>` (linear time)."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: m.group("head") + REDACTED + "@", text)
    text = _AUTH_HEADER.sub(_auth, text)
    text = _SSHPASS.sub(_keep_head, text)
    text = _LONG_FLAG.sub(_secret_flag, text)
    return _redact_assignments(text)


# Deeper than this is not a facts report; the walk stops there instead of recursing on.
MAX_DEPTH = 64


def redact_facts(obj: Any, _depth: int = 0) -> Any:
    """Return a copy of a facts tree with secret values blanked.

    Any mapping key that looks secret gets its value replaced (the `env` section is the usual
    place, but a rogue probe could put one anywhere); every string is also passed through
    `redact_text`. Subtrees deeper than MAX_DEPTH become "<too deep>" (no RecursionError).
    """
    if _depth > MAX_DEPTH:
        return "<too deep>"
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_name(key) and value is not None:
                out[key] = REDACTED
            else:
                out[key] = redact_facts(value, _depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact_facts(item, _depth + 1) for item in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
