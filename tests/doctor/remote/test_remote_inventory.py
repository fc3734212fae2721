"""Fleet files: prefix lists and Ansible inventories (INI and YAML) -> argv prefixes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sshd_server import ThrowawaySshd

from fastpath.doctor.fleet import probe_fleet
from fastpath.doctor.inventory import load_targets
from fastpath.shared.errors import UsageError

INI = """\
# a Proxmox node and the containers behind it
[gpu]
node1 ansible_host=10.0.0.5 ansible_user=ops ansible_port=2222
node[2:3] ansible_user=admin
node2 ansible_ssh_private_key_file=/keys/n2

[ctr]
ct200 ansible_host=pve1 ansible_ssh_common_args='-J bastion -o StrictHostKeyChecking=no'
local-box ansible_connection=local ansible_python_interpreter=/usr/bin/python3

[cluster:children]
gpu

[gpu:vars]
ansible_user=gpuadmin
ansible_ssh_extra_args="-o ConnectTimeout=3"

[all:vars]
ansible_port=22
"""

YAML = """\
all:
  vars:
    ansible_port: 22
  children:
    cluster:
      children:
        gpu:
          hosts:
            node1: {ansible_host: 10.0.0.5, ansible_user: ops, ansible_port: 2222}
            node[2:3]: {ansible_user: admin}
            node2: {ansible_ssh_private_key_file: /keys/n2}
          vars:
            ansible_user: gpuadmin
            ansible_ssh_extra_args: "-o ConnectTimeout=3"
    ctr:
      hosts:
        ct200:
          ansible_host: pve1
          ansible_ssh_common_args: "-J bastion -o StrictHostKeyChecking=no"
        local-box:
          ansible_connection: local
          ansible_python_interpreter: /usr/bin/python3
"""

BATCH = ["-o", "BatchMode=yes", "--"]
EXPECTED = {
    "node1": ["ssh", "-o", "ConnectTimeout=3", "-p", "2222", "-l", "ops", *BATCH, "10.0.0.5"],
    "node2": ["ssh", "-o", "ConnectTimeout=3", "-p", "22", "-l", "admin", "-i", "/keys/n2", *BATCH, "node2"],
    "node3": ["ssh", "-o", "ConnectTimeout=3", "-p", "22", "-l", "admin", *BATCH, "node3"],
    "ct200": ["ssh", "-J", "bastion", "-o", "StrictHostKeyChecking=no", "-p", "22", *BATCH, "pve1"],
    "local-box": ["env"],
}


@pytest.mark.parametrize(("name", "text"), [("hosts.ini", INI), ("hosts.yml", YAML)])
def test_ansible_inventory(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    targets = load_targets(path)
    assert {t.name: t.prefix for t in targets} == EXPECTED
    by_name = {t.name: t for t in targets}
    assert by_name["local-box"].python == "/usr/bin/python3"
    assert "gpu" in by_name["node2"].groups and "cluster" in by_name["node2"].groups
    # --limit: a group (children included), a host, a union
    assert [t.name for t in load_targets(path, "cluster")] == ["node1", "node2", "node3"]
    assert [t.name for t in load_targets(path, "ctr")] == ["ct200", "local-box"]
    assert [t.name for t in load_targets(path, "node3,ct200")] == ["node3", "ct200"]
    assert [t.name for t in load_targets(path, "node*")] == ["node1", "node2", "node3"]
    assert [t.name for t in load_targets(path, "cluster:!node2")] == ["node1", "node3"]
    assert [t.name for t in load_targets(path, "all:&ctr")] == ["ct200", "local-box"]
    assert [t.name for t in load_targets(path, "!gpu")] == ["ct200", "local-box"]
    with pytest.raises(UsageError, match="no such group or host"):
        load_targets(path, "nope")
    with pytest.raises(UsageError, match="no such group or host"):
        load_targets(path, "db*")


def test_prefix_list(tmp_path: Path) -> None:
    path = tmp_path / "fleet.txt"
    path.write_text(
        "# one prefix per line\n"
        "ssh gpu1\n"
        "\n"
        "ssh gpu1 pct exec 200 --   # the container\n"
        "docker exec -i 'my ctr'\n"
        "kubectl exec -i pod-0 --\n"
        "ssh node#2 'echo # not a comment' # a comment\n"
    )
    targets = load_targets(path)
    assert [t.prefix for t in targets] == [
        ["ssh", "gpu1"],
        ["ssh", "gpu1", "pct", "exec", "200", "--"],
        ["docker", "exec", "-i", "my ctr"],
        ["kubectl", "exec", "-i", "pod-0", "--"],
        ["ssh", "node#2", "echo # not a comment"],
    ]
    assert targets[2].name == "docker exec -i 'my ctr'"
    with pytest.raises(UsageError, match="--limit needs an Ansible inventory"):
        load_targets(path, "gpu")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("evil ansible_host=-oProxyCommand=touch_PWNED", "unsafe ansible_host"),
        ("evil ansible_host='h;touch PWNED'", "unsafe ansible_host"),
        ("evil ansible_user='-oProxyCommand=x'", "unsafe ansible_user"),
        ("evil ansible_port='22;id'", "is not a number"),
        ("evil ansible_connection=paramiko", "not supported"),
        ("evil ansible_connection=kubectl ansible_kubectl_pod=-it", "unsafe ansible_kubectl_pod"),
        ("evil ansible_connection=kubectl ansible_kubectl_namespace='a b'", "unsafe ansible_kubectl"),
        ("evil ansible_connection=kubectl ansible_kubectl_kubeconfig=-x", "unsafe ansible_kubectl"),
        ("evil notakeyvalue", "expected key=value"),
    ],
)
def test_inventory_values_cannot_inject(tmp_path: Path, line: str, message: str) -> None:
    """A bad file is a usage error; a bad host is refused (never run) and the others go on."""
    path = tmp_path / "hosts.ini"
    path.write_text(f"[gpu]\n{line}\ngood ansible_host=gpu1\n")
    if message == "expected key=value":
        with pytest.raises(UsageError, match=message):
            load_targets(path)
        return
    evil, good = load_targets(path)
    assert evil.prefix == [] and evil.error is not None and message in evil.error
    assert good.error is None and good.prefix[-1] == "gpu1"


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_targets(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(UsageError, match="no targets"):
        load_targets(empty)
    bad = tmp_path / "bad.yml"
    bad.write_text("all: [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_targets(bad)


def test_inventory_targets_reach_sshd(sshd: ThrowawaySshd, tmp_path: Path) -> None:
    """An Ansible inventory pointing at the throwaway sshd: every ansible_* var really used."""
    common = " ".join(sshd.ssh_args()[3:])  # the -i KEY -o ... options, without ssh -p PORT
    path = tmp_path / "hosts.ini"
    path.write_text(
        "[lab]\n"
        f"box1 ansible_host=127.0.0.1 ansible_port={sshd.port}\n"
        f"box2 ansible_host=127.0.0.1 ansible_port={sshd.port} ansible_python_interpreter=/nonexistent/python3\n"
        "[lab:vars]\n"
        f"ansible_user={sshd.user}\n"
        f"ansible_ssh_common_args='{common}'\n"
    )
    targets = load_targets(path, "lab")
    results = asyncio.run(probe_fleet(targets, timeout=60))
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert results[0].facts["probe"]["kind"] == "python"
    assert results[1].facts["probe"]["kind"] == "sh"  # its interpreter does not exist there
    assert "'/nonexistent/python3' not found" in results[1].facts["probe"]["errors"]["torch"]


def test_cli_yaml_inventory_with_limit(sshd: ThrowawaySshd, tmp_path: Path) -> None:
    """`fastpath doctor --hosts inv.yml --limit lab --json` end to end over the throwaway sshd."""
    common = " ".join(sshd.ssh_args()[3:])
    path = tmp_path / "inventory.yml"
    path.write_text(
        "all:\n"
        "  children:\n"
        "    lab:\n"
        "      hosts:\n"
        "        box1:\n"
        "          ansible_host: 127.0.0.1\n"
        "      vars:\n"
        f"        ansible_port: {sshd.port}\n"
        f"        ansible_user: {sshd.user}\n"
        f"        ansible_ssh_common_args: '{common}'\n"
        "        ansible_python_interpreter: /usr/bin/python3\n"
        "    elsewhere:\n"
        "      hosts:\n"
        "        never-contacted: {ansible_host: 127.0.0.1, ansible_port: 1}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "fastpath", "doctor", "--hosts", str(path), "--limit", "lab", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    report = json.loads(run.stdout)
    assert [t["name"] for t in report["targets"]] == ["box1"]
    [box1] = report["targets"]
    assert box1["status"] == "ok", box1["error"]
    assert box1["groups"] == ["lab"]
    assert box1["report"]["facts"]["host"]["executable"] == "/usr/bin/python3"
    assert run.returncode == box1["report"]["exit_code"]


def test_container_connections(tmp_path: Path) -> None:
    """docker, kubectl and lxd hosts become the exec prefixes Ansible's connections would use."""
    path = tmp_path / "hosts.ini"
    path.write_text(
        "[pods]\n"
        "trainer-0 ansible_connection=kubernetes.core.kubectl ansible_kubectl_namespace=ml "
        "ansible_kubectl_container=main ansible_kubectl_kubeconfig=/etc/kube/config\n"
        "trainer-1 ansible_connection=kubectl ansible_kubectl_pod=trainer-1-abcde "
        "ansible_kubectl_context=prod\n"
        "[boxes]\n"
        "box ansible_connection=docker ansible_host=gpu-box\n"
        "ct200 ansible_connection=community.general.lxd\n"
    )
    prefixes = {t.name: t.prefix for t in load_targets(path)}
    assert prefixes["trainer-0"] == ["kubectl", "--kubeconfig", "/etc/kube/config", "exec", "-i",
                                     "-n", "ml", "trainer-0", "-c", "main", "--"]
    assert prefixes["trainer-1"] == ["kubectl", "--context", "prod", "exec", "-i",
                                     "trainer-1-abcde", "--"]
    assert prefixes["box"] == ["docker", "exec", "-i", "gpu-box"]
    assert prefixes["ct200"] == ["lxc", "exec", "ct200", "--"]
