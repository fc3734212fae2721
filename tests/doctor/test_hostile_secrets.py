"""Secrets are redacted by shape on every output path (text report, JSON,
progress lines, error lines, fleet table, local --json). Each shape from the issue carries its
own marker, and every output is searched for every marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile_fakes import facts, fake_target, fastpath, framed

from fastpath.shared.redact import REDACTED, redact_text

SHAPES = {
    "sshpass -p SEKRET01 ssh gpu1": "SEKRET01",
    "sshpass -e -pSEKRET02 ssh gpu1": "SEKRET02",
    "ssh://root:SEKRET03@gpu1": "SEKRET03",
    "env MYSQL_PWD=SEKRET04 python3": "SEKRET04",
    "-o 'ProxyCommand=sshpass -p SEKRET05 ssh -W %h:%p jump'": "SEKRET05",
    "HF_ENDPOINT=https://user:SEKRET06@hub.example": "SEKRET06",
    "HF_HUB_AUTH=SEKRET07": "SEKRET07",
    "FASTPATH_API_PASS=SEKRET08": "SEKRET08",
    "curl: (22) https://u:SEKRET09@x.example/y": "SEKRET09",
    "Authorization: Bearer SEKRET10": "SEKRET10",
    "Authorization: Basic SEKRET11": "SEKRET11",
    "tool --password SEKRET12 --user x": "SEKRET12",
    "tool --api-token=SEKRET13": "SEKRET13",
    '{"HF_PASSWD": "SEKRET14"}': "SEKRET14",
    "bearer SEKRET15": "SEKRET15",
}


@pytest.mark.parametrize("text", sorted(SHAPES))
def test_each_shape_is_redacted(text: str) -> None:
    out = redact_text(text)
    assert SHAPES[text] not in out and REDACTED in out, out


def test_not_secrets_stay_readable() -> None:
    for text in ("ssh -o StrictHostKeyChecking=no -o PasswordAuthentication=no gpu1",
                 "KeyError: 'gpus'", "https://hub.example/models", "basic setup done"):
        assert redact_text(text) == text


def _all_outputs(*procs) -> bytes:  # type: ignore[no-untyped-def]
    return b"\n".join(p.stdout + p.stderr for p in procs)


def test_no_output_path_leaks(tmp_path: Path) -> None:
    hostile = facts(
        env={"HF_ENDPOINT": "https://user:SEKRET06@hub.example", "HF_HUB_AUTH": "SEKRET07",
             "FASTPATH_API_PASS": "SEKRET08", "PATH": "/usr/bin"},
        probe={"kind": "python", "errors": {
            "torch": "could not collect: curl: (22) https://u:SEKRET09@x.example/y",
            "gpus": "could not collect: Authorization: Bearer SEKRET10"}},
    )
    good = fake_target(tmp_path, "good", stdout=framed(hostile))
    # the prefix itself carries secrets (shown in labels, tables, JSON "prefix", errors)
    good_prefix = " ".join(good) + " sshpass -p SEKRET01 ssh://root:SEKRET03@gpu1 --password SEKRET12"
    failing = " ".join(fake_target(tmp_path, "bad", exit=3,
                                   stderr="fatal: Authorization: Basic SEKRET11\n"))
    env_prefix = "env MYSQL_PWD=SEKRET04 " + " ".join(
        fake_target(tmp_path, "envt", stdout=framed(facts())))
    hosts = tmp_path / "fleet.txt"
    hosts.write_text("\n".join([good_prefix, failing, env_prefix]) + "\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        "[gpu]\n"
        "jump ansible_host=127.0.0.1 ansible_port=9 ansible_ssh_common_args="
        "'-o ProxyCommand=\"sshpass -p SEKRET05 ssh -W %h:%p jump\"'\n")
    runs = [
        fastpath("doctor", "--on", good_prefix, "--timeout", "30"),
        fastpath("doctor", "--on", good_prefix, "--timeout", "30", "--json"),
        fastpath("doctor", "--on", failing + " --password SEKRET12", "--timeout", "30"),
        fastpath("doctor", "--hosts", str(hosts), "--timeout", "30"),
        fastpath("doctor", "--hosts", str(hosts), "--timeout", "30", "--json"),
        fastpath("doctor", "--hosts", str(inventory), "--timeout", "30"),
        fastpath("doctor", "--hosts", str(inventory), "--timeout", "30", "--json"),
    ]
    out = _all_outputs(*runs)
    leaked = sorted(s for s in SHAPES.values() if s.encode() in out)
    assert not leaked, leaked
    assert b"<redacted>" in out
    fleet = json.loads(runs[4].stdout)
    assert [t["status"] for t in fleet["targets"]] == ["ok", "failed", "ok"]


def test_local_json_and_text_are_redacted() -> None:
    secrets = {"HF_PASSWD": "SEKRET14", "HF_HUB_AUTH": "SEKRET07",
               "FASTPATH_API_PASS": "SEKRET08", "HF_ENDPOINT": "https://u:SEKRET06@h.example"}
    runs = [fastpath("doctor", "--probe", "static", "--json", extra_env=secrets, timeout=180),
            fastpath("doctor", "--probe", "static", extra_env=secrets, timeout=180)]
    assert runs[0].returncode in (0, 1), runs[0].stderr.decode()[-2000:]
    out = _all_outputs(*runs)
    leaked = sorted(s for s in secrets.values() if s.encode() in out)
    assert not leaked, leaked
