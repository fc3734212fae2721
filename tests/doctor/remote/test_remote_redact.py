"""Redaction of secret-looking values: every facts dict from a target and every printed string."""

from __future__ import annotations

from fastpath.shared.redact import REDACTED, is_secret_name, redact_facts, redact_text


def test_secret_names() -> None:
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GOOGLE_CREDENTIALS", "api_key"):
        assert is_secret_name(name)
    for name in ("PATH", "CUDA_HOME", "StrictHostKeyChecking", "HostKeyAlias", "kernel"):
        assert not is_secret_name(name)


def test_redact_text_forms() -> None:
    assert redact_text("env HF_TOKEN=hunter2 CUDA_HOME=/x") == f"env HF_TOKEN={REDACTED} CUDA_HOME=/x"
    assert redact_text('{"HF_TOKEN": "a b", "PATH": "/bin"}') == f'{{"HF_TOKEN": "{REDACTED}", "PATH": "/bin"}}'
    assert redact_text("AWS_SECRET_ACCESS_KEY: abc") == f"AWS_SECRET_ACCESS_KEY: {REDACTED}"
    # ssh options that merely contain "key" stay readable
    assert redact_text("ssh -o StrictHostKeyChecking=no h") == "ssh -o StrictHostKeyChecking=no h"
    assert redact_text(f"HF_TOKEN={REDACTED}") == f"HF_TOKEN={REDACTED}"


def test_redact_facts_everywhere() -> None:
    facts = {
        "env": {"HF_TOKEN": "hunter2", "PATH": "/usr/bin", "WANDB_API_KEY": "k"},
        "probe": {"errors": {"torch": "could not collect: GITHUB_TOKEN=ghp_x in output"}},
        "nested": [{"MY_PASSWORD": {"deep": "x"}}],
        "gpus": [],
        "driver": None,
    }
    out = redact_facts(facts)
    assert out["env"] == {"HF_TOKEN": REDACTED, "PATH": "/usr/bin", "WANDB_API_KEY": REDACTED}
    assert out["probe"]["errors"]["torch"] == f"could not collect: GITHUB_TOKEN={REDACTED} in output"
    assert out["nested"] == [{"MY_PASSWORD": REDACTED}]
    assert out["gpus"] == [] and out["driver"] is None
    assert facts["env"]["HF_TOKEN"] == "hunter2"  # the input is not modified
