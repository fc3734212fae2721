"""Redaction of secret-looking values in facts and rendered text.

The probe redacts on the target already; this is the second line of defence, applied to every
facts dict a target sends back and to every string we print, because a report is the kind of
thing people paste into issues and chat.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

# Substrings of a variable name that mark its value as secret (matched case-insensitively).
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")

_SECRET_NAME = re.compile("|".join(SECRET_NAME_PARTS), re.IGNORECASE)

# OpenSSH option names that contain "key" but hold no secret (they show up in target prefixes).
_NOT_SECRET = frozenset(
    name.lower()
    for name in (
        "StrictHostKeyChecking", "HostKeyAlgorithms", "HostKeyAlias", "HostbasedAcceptedAlgorithms",
        "PubkeyAuthentication", "PubkeyAcceptedAlgorithms", "PubkeyAcceptedKeyTypes",
        "UpdateHostKeys", "VerifyHostKeyDNS", "AddKeysToAgent", "RevokedHostKeys",
        "KbdInteractiveAuthentication", "KbdInteractiveDevices", "HostKey",
    )
)

# NAME=value, NAME: value, "NAME": "value" and 'NAME'='value' where NAME looks secret.
# The value runs to the next whitespace (or closing quote when quoted).
_SECRET_ASSIGNMENT = re.compile(
    r"""(?P<name>\b[A-Za-z0-9_.-]*?(?:TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL)[A-Za-z0-9_.-]*)"""
    r"""(?P<q1>["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?:(?P<q2>["'])(?P<qval>(?:\\.|(?!(?P=q2)).)*)(?P=q2)|(?P<val>[^\s,;}\]"']+))""",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """True when a variable name looks like it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY...)."""
    return name.lower() not in _NOT_SECRET and bool(_SECRET_NAME.search(name))


def _replace_assignment(match: re.Match[str]) -> str:
    value = match.group("qval") if match.group("q2") else match.group("val")
    if value == REDACTED or not is_secret_name(match.group("name")):
        return match.group(0)
    head = match.group("name") + match.group("q1") + match.group("sep")
    if match.group("q2"):
        return f"{head}{match.group('q2')}{REDACTED}{match.group('q2')}"
    return head + REDACTED


def redact_text(text: str) -> str:
    """Blank the value of every `SECRET_NAME=value` / `"SECRET_NAME": "value"` in a string."""
    return _SECRET_ASSIGNMENT.sub(_replace_assignment, text)


def redact_facts(obj: Any) -> Any:
    """Return a copy of a facts tree with secret values blanked.

    Any mapping key that looks secret gets its value replaced (the `env` section is the usual
    place, but a rogue probe could put one anywhere); every string is also passed through
    `redact_text`, so `PATH`-like values or error messages that embed `X_TOKEN=...` are cleaned.
    """
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if isinstance(key, str) and is_secret_name(key) and value is not None:
                out[key] = REDACTED
            else:
                out[key] = redact_facts(value)
        return out
    if isinstance(obj, list):
        return [redact_facts(item) for item in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
