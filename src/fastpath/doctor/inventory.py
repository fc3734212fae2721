"""Fleet files: a list of target prefixes, or an Ansible inventory (INI or YAML).

Every target ends up as an argv prefix (see fastpath.doctor.remote). From an Ansible inventory we build
`ssh [ansible_ssh_common_args] [ansible_ssh_extra_args] -p PORT -l USER [-i KEY] -o BatchMode=yes
-- HOST`, honouring ansible_host, ansible_user, ansible_port, ansible_ssh_private_key_file and
ansible_python_interpreter; `ansible_connection=local`
runs on this machine, `docker` through `docker exec -i`, `kubectl` through `kubectl exec -i POD --`
(ansible_kubectl_pod / _namespace / _container / _context / _kubeconfig) and `lxd` through
`lxc exec NAME --`. Host and user values are checked so they cannot smuggle options in (a host
`-oProxyCommand=...` would run a local command).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.doctor.remote import target_label
from fastpath.errors import UsageError


@dataclass
class Target:
    """One machine/container to probe: a display name, its argv prefix, and its groups."""

    name: str
    prefix: list[str]
    python: str | None = None
    groups: list[str] = field(default_factory=list)


@dataclass
class _Group:
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


class _Inventory:
    """Groups -> hosts, children and vars, as Ansible models them (host vars beat group vars)."""

    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_order: list[str] = []

    def group(self, name: str) -> _Group:
        return self.groups.setdefault(name, _Group())

    def add_host(self, group: str, host: str, hostvars: dict[str, Any]) -> None:
        if host not in self.host_vars:
            self.host_vars[host] = {}
            self.host_order.append(host)
        self.host_vars[host].update(hostvars)
        members = self.group(group).hosts
        if host not in members:
            members.append(host)

    def expand(self, group: str, seen: frozenset[str] = frozenset()) -> list[str]:
        """Hosts of a group and of its children, recursively, in file order."""
        if group == "all":
            return list(self.host_order)
        if group in seen or group not in self.groups:
            return []
        g = self.groups[group]
        hosts = list(g.hosts)
        for child in g.children:
            hosts += [h for h in self.expand(child, seen | {group}) if h not in hosts]
        return hosts

    def groups_of(self, host: str) -> list[str]:
        """Groups containing the host, parents before children (so children's vars win)."""
        containing = [g for g in self.groups if g != "all" and host in self.expand(g)]

        def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
            parents = [p for p, g in self.groups.items() if name in g.children and p not in seen]
            return 1 + max((depth(p, seen | {name}) for p in parents), default=0)

        return sorted(containing, key=depth)

    def vars_for(self, host: str) -> dict[str, Any]:
        merged: dict[str, Any] = dict(self.groups["all"].vars)
        for g in self.groups_of(host):
            merged.update(self.groups[g].vars)
        merged.update(self.host_vars.get(host, {}))
        return merged


# --- host patterns ------------------------------------------------------------------------------
_RANGE = re.compile(r"\[([0-9]+):([0-9]+)\]|\[([a-z]):([a-z])\]")


def _expand_host_pattern(pattern: str) -> list[str]:
    """Ansible host ranges: web[01:03] -> web01 web02 web03, db-[a:c] -> db-a db-b db-c."""
    m = _RANGE.search(pattern)
    if not m:
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if m.group(1) is not None:
        lo, hi = m.group(1), m.group(2)
        width = len(lo) if lo.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        items = [chr(c) for c in range(ord(m.group(3)), ord(m.group(4)) + 1)]
    return [h for item in items for h in _expand_host_pattern(head + item + tail)]


# --- INI ----------------------------------------------------------------------------------------
def _parse_kv(tokens: list[str], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tok in tokens:
        if "=" not in tok:
            raise UsageError(f"{where}: expected key=value, got {tok!r}")
        key, value = tok.split("=", 1)
        out[key] = value
    return out


def _parse_ini(text: str, source: str) -> _Inventory:
    inv = _Inventory()
    section, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        where = f"{source}:{lineno}"
        if line.startswith("["):
            if not line.endswith("]"):
                raise UsageError(f"{where}: bad section header {line!r}")
            name = line[1:-1].strip()
            section, _, suffix = name.partition(":")
            kind = suffix or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise UsageError(f"{where}: unknown section kind {suffix!r}")
            inv.group(section)
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
        if not tokens:
            continue
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise UsageError(f"{where}: expected key=value in [{section}:vars]")
            value = value.strip()
            try:
                parts = shlex.split(value)
                value = parts[0] if len(parts) == 1 else value
            except ValueError:
                pass
            inv.group(section).vars[key.strip()] = value
        elif kind == "children":
            inv.group(tokens[0])
            if tokens[0] not in inv.group(section).children:
                inv.group(section).children.append(tokens[0])
        else:
            hostvars = _parse_kv(tokens[1:], where)
            for host in _expand_host_pattern(tokens[0]):
                inv.add_host(section, host, hostvars)
    return inv


# --- YAML ---------------------------------------------------------------------------------------
def _parse_yaml(text: str, source: str) -> _Inventory:
    try:
        import yaml
    except ImportError:
        raise UsageError(
            f"{source}: YAML inventories need PyYAML (pip install pyyaml), or use the INI form"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source}: a YAML inventory is a mapping of groups (e.g. 'all:')")
    inv = _Inventory()

    def walk(name: str, body: Any, path: str) -> None:
        inv.group(name)
        if body is None:
            return
        if not isinstance(body, dict):
            raise UsageError(f"{source}: group {path} must be a mapping")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise UsageError(f"{source}: {path}.hosts must be a mapping of host -> vars")
        for pattern, hostvars in hosts.items():
            if hostvars is not None and not isinstance(hostvars, dict):
                raise UsageError(f"{source}: vars of host {pattern} in {path} must be a mapping")
            for host in _expand_host_pattern(str(pattern)):
                inv.add_host(name, host, dict(hostvars or {}))
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise UsageError(f"{source}: {path}.vars must be a mapping")
        inv.group(name).vars.update(gvars)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise UsageError(f"{source}: {path}.children must be a mapping")
        for child, child_body in children.items():
            child = str(child)
            if child not in inv.group(name).children:
                inv.group(name).children.append(child)
            walk(child, child_body, f"{path}.children.{child}")

    for name, body in data.items():
        walk(str(name), body, str(name))
    return inv


# --- targets from an inventory ------------------------------------------------------------------
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.:%@\[\]-]+$")


def _checked(value: Any, what: str, host: str) -> str:
    text = str(value)
    if not text or text.startswith("-") or not _SAFE_TOKEN.match(text):
        raise UsageError(f"inventory host {host!r}: unsafe {what} {text!r}")
    return text


def _split_args(value: Any, what: str, host: str) -> list[str]:
    try:
        return shlex.split(str(value))
    except ValueError as exc:
        raise UsageError(f"inventory host {host!r}: cannot split {what}: {exc}") from None


def _target_from_vars(host: str, hostvars: dict[str, Any], groups: list[str]) -> Target:
    connection = str(hostvars.get("ansible_connection", "ssh"))
    python = hostvars.get("ansible_python_interpreter")
    python = str(python) if python else None
    if connection == "local":
        return Target(host, ["env"], python, groups)
    address = _checked(hostvars.get("ansible_host", host), "ansible_host", host)
    if connection in ("docker", "community.docker.docker"):
        return Target(host, ["docker", "exec", "-i", address], python, groups)
    if connection in ("kubectl", "kubernetes.core.kubectl", "community.kubernetes.kubectl"):
        return Target(host, _kubectl_prefix(host, hostvars), python, groups)
    if connection in ("lxd", "community.general.lxd"):
        return Target(host, ["lxc", "exec", address, "--"], python, groups)
    if connection not in ("ssh", "smart", "ansible.builtin.ssh"):
        raise UsageError(
            f"inventory host {host!r}: ansible_connection={connection!r} is not supported "
            "(ssh, local, docker, kubectl, lxd); write the prefix in a prefix list instead"
        )
    argv = ["ssh"]
    argv += _split_args(hostvars.get("ansible_ssh_common_args", ""), "ansible_ssh_common_args", host)
    argv += _split_args(hostvars.get("ansible_ssh_extra_args", ""), "ansible_ssh_extra_args", host)
    port = hostvars.get("ansible_port", hostvars.get("ansible_ssh_port"))
    if port is not None:
        if not str(port).isdigit():
            raise UsageError(f"inventory host {host!r}: ansible_port {port!r} is not a number")
        argv += ["-p", str(port)]
    user = hostvars.get("ansible_user", hostvars.get("ansible_ssh_user"))
    if user is not None:
        argv += ["-l", _checked(user, "ansible_user", host)]
    key_file = hostvars.get("ansible_ssh_private_key_file", hostvars.get("ansible_private_key_file"))
    if key_file:
        argv += ["-i", str(key_file)]
    # No password prompts from 32 parallel sessions (options given above take precedence).
    argv += ["-o", "BatchMode=yes", "--", address]
    return Target(host, argv, python, groups)


def _kubectl_prefix(host: str, hostvars: dict[str, Any]) -> list[str]:
    """`kubectl [--kubeconfig K] [--context C] exec -i [-n NS] POD [-c CTR] --`, from the
    variables Ansible's kubectl connection reads (the pod defaults to the inventory name)."""
    def var(name: str) -> str | None:
        value = hostvars.get(f"ansible_kubectl_{name}")
        if not value:
            return None
        if name == "kubeconfig":  # a path: any characters, but never an option
            if str(value).startswith("-"):
                raise UsageError(f"inventory host {host!r}: unsafe ansible_kubectl_kubeconfig")
            return str(value)
        return _checked(value, f"ansible_kubectl_{name}", host)

    argv = ["kubectl"]
    for flag, name in (("--kubeconfig", "kubeconfig"), ("--context", "context")):
        if var(name):
            argv += [flag, var(name)]
    argv += ["exec", "-i"]
    if var("namespace"):
        argv += ["-n", var("namespace")]
    argv.append(var("pod") or _checked(host, "inventory name", host))
    if var("container"):
        argv += ["-c", var("container")]
    return [*argv, "--"]


def _looks_like_ini_inventory(text: str) -> bool:
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if re.match(r"^\[[^\]]+\]$", line) or "ansible_" in line:
            return True
    return False


def _looks_like_yaml_inventory(path: Path, text: str) -> bool:
    if path.suffix in (".yml", ".yaml"):
        return True
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        return line == "---" or bool(re.match(r"^[A-Za-z0-9_.-]+:\s*$", line))
    return False


def _match(inv: _Inventory, pattern: str, source: str) -> list[str]:
    """Hosts named by one --limit word: a group (with its children), a host, or a glob of either."""
    if pattern in inv.groups:
        return inv.expand(pattern)
    if pattern in inv.host_vars:
        return [pattern]
    if any(ch in pattern for ch in "*?["):
        hosts: list[str] = []
        for group in fnmatch.filter(list(inv.groups), pattern):
            hosts += [h for h in inv.expand(group) if h not in hosts]
        hosts += [h for h in fnmatch.filter(inv.host_order, pattern) if h not in hosts]
        if hosts:
            return hosts
    known = ", ".join(sorted(g for g in inv.groups if g not in ("ungrouped",)))
    raise UsageError(f"--limit {pattern!r}: no such group or host in {source} (groups: {known})")


def _select(inv: _Inventory, limit: str | None, source: str) -> list[str]:
    """Ansible-style --limit: `a,b` or `a:b` union, `!x` excludes, `&x` intersects, globs allowed."""
    if not limit:
        return list(inv.host_order)
    chosen: list[str] = []
    words = [w.strip() for w in re.split(r"[,:]", limit) if w.strip()]
    for word in (w for w in words if w[0] not in "!&"):
        chosen += [h for h in _match(inv, word, source) if h not in chosen]
    if not chosen and words and all(w[0] in "!&" for w in words):
        chosen = list(inv.host_order)  # `--limit '!db'`: everything but db
    for word in (w for w in words if w[0] == "&"):
        keep = set(_match(inv, word[1:], source))
        chosen = [h for h in chosen if h in keep]
    for word in (w for w in words if w[0] == "!"):
        drop = set(_match(inv, word[1:], source))
        chosen = [h for h in chosen if h not in drop]
    return chosen


def _strip_comment(line: str) -> str:
    """Drop a `# comment` the way sh does: '#' starts one only at the start of a word and
    outside quotes (shlex's comments=True would also cut `host#2`)."""
    quote = None
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def parse_prefix_list(text: str, source: str) -> list[Target]:
    """One target prefix per line; '#' starts a comment (at a word start, outside quotes). A line
    that is one bare word is a host name to ssh to, as in an Ansible inventory."""
    targets: list[Target] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        try:
            argv = shlex.split(_strip_comment(raw))
        except ValueError as exc:
            raise UsageError(f"{source}:{lineno}: {exc}") from None
        if len(argv) == 1 and _SAFE_TOKEN.match(argv[0]) and not argv[0].startswith("-"):
            targets.append(_target_from_vars(argv[0], {}, []))
        elif argv:
            targets.append(Target(target_label(argv), argv))
    return targets


def load_targets(path: str | Path, limit: str | None = None) -> list[Target]:
    """Targets from a fleet file (prefix list, INI or YAML inventory); UsageError on bad input."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--hosts {source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--hosts {source}: cannot read: {exc}") from None
    if _looks_like_yaml_inventory(path, text):
        inv = _parse_yaml(text, source)
    elif _looks_like_ini_inventory(text):
        inv = _parse_ini(text, source)
    else:
        if limit:
            raise UsageError("--limit needs an Ansible inventory (a prefix list has no groups)")
        targets = parse_prefix_list(text, source)
        if not targets:
            raise UsageError(f"--hosts {source}: no targets in the file")
        return targets
    hosts = _select(inv, limit, source)
    if not hosts:
        raise UsageError(f"--hosts {source}: no hosts{' in ' + limit if limit else ''}")
    return [_target_from_vars(h, inv.vars_for(h), inv.groups_of(h)) for h in hosts]
