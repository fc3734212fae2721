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
from fastpath.shared.errors import UsageError
from fastpath.shared.plain_text import plain
from fastpath.shared.redact import redact_text


@dataclass
class Target:
    """One machine/container to probe: a display name, its argv prefix, and its groups.
    error: why this inventory entry is refused (an unsafe value): reported, never run."""

    name: str
    prefix: list[str]
    python: str | None = None
    groups: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class _Group:
    hosts: dict[str, None] = field(default_factory=dict)  # ordered set
    children: dict[str, None] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)


class _Inventory:
    """Groups -> hosts, children and vars, as Ansible models them (host vars beat group vars)."""

    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {"all": _Group(), "ungrouped": _Group()}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_order: list[str] = []
        self._members: dict[str, dict[str, None]] | None = None

    def group(self, name: str) -> _Group:
        return self.groups.setdefault(name, _Group())

    def add_host(self, group: str, host: str, hostvars: dict[str, Any]) -> None:
        if host not in self.host_vars:
            self.host_vars[host] = {}
            self.host_order.append(host)
        self.host_vars[host].update(hostvars)
        self.group(group).hosts[host] = None
        self._members = None

    def add_child(self, parent: str, child: str) -> None:
        self.group(child)
        self.group(parent).children[child] = None
        self._members = None

    def members(self) -> dict[str, dict[str, None]]:
        """Every group's hosts including its children's, computed once for all groups (each
        group's set built from its children's already-built sets: linear in the inventory,
        cycles cut)."""
        if self._members is not None:
            return self._members
        done: dict[str, dict[str, None]] = {}
        for root in self.groups:
            if root in done:
                continue
            # iterative post-order DFS; a group on the current path is a cycle: skipped
            stack: list[tuple[str, Any]] = [(root, iter(self.groups[root].children))]
            on_path = {root}
            while stack:
                name, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    on_path.discard(name)
                    hosts = dict(self.groups[name].hosts)
                    for c in self.groups[name].children:
                        hosts.update(done.get(c, {}))
                    done[name] = hosts
                elif child not in done and child not in on_path and child in self.groups:
                    on_path.add(child)
                    stack.append((child, iter(self.groups[child].children)))
        self._members = done
        return done

    def expand(self, group: str) -> list[str]:
        """Hosts of a group and of its children, recursively, in file order."""
        if group == "all":
            return list(self.host_order)
        return list(self.members().get(group, {}))

    def _depths(self) -> dict[str, int]:
        """Each group's depth below `all` (parents before children, so children's vars win)."""
        parents: dict[str, list[str]] = {}
        for name, g in self.groups.items():
            for child in g.children:
                parents.setdefault(child, []).append(name)
        depth: dict[str, int] = {}
        for root in self.groups:
            stack = [root]
            on_path: set[str] = set()
            while stack:
                name = stack[-1]
                if name in depth:
                    stack.pop()
                    continue
                on_path.add(name)
                todo = [p for p in parents.get(name, []) if p not in depth and p not in on_path]
                if todo:
                    stack.extend(todo)
                    continue
                depth[name] = 1 + max((depth.get(p, 0) for p in parents.get(name, [])), default=0)
                on_path.discard(name)
                stack.pop()
        return depth

    def host_groups(self) -> dict[str, list[str]]:
        """host -> groups containing it (not `all`), parents before children."""
        depth = self._depths()
        out: dict[str, list[str]] = {h: [] for h in self.host_order}
        for name in sorted((g for g in self.groups if g != "all"), key=lambda g: depth.get(g, 0)):
            for host in self.members().get(name, {}):
                out.setdefault(host, []).append(name)
        return out

    def groups_of(self, host: str) -> list[str]:
        """Groups containing the host, parents before children (so children's vars win)."""
        return self.host_groups().get(host, [])

    def vars_for(self, host: str, groups: list[str] | None = None) -> dict[str, Any]:
        merged: dict[str, Any] = dict(self.groups["all"].vars)
        for g in self.groups_of(host) if groups is None else groups:
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


_SHELL_SYNTAX = re.compile(r"""['"\\#]""")


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
        try:  # plain lines (most of a big inventory) need no shell-style parsing
            tokens = line.split() if not _SHELL_SYNTAX.search(line) else \
                shlex.split(line, comments=True)
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
            inv.add_child(section, tokens[0])
        else:
            hostvars = _parse_kv(tokens[1:], where)
            for host in _expand_host_pattern(tokens[0]):
                inv.add_host(section, host, hostvars)
    return inv


# --- YAML ---------------------------------------------------------------------------------------
# What a YAML inventory may expand to once its aliases (`*name`) are followed: a 1 KB file of
# nested aliases can stand for billions of nodes ("billion laughs"), and an alias inside its own
# anchor for infinitely many.
MAX_YAML_NODES = 1_000_000


def _check_yaml_size(data: Any, source: str) -> None:
    """UsageError (one line) for recursive aliases or an expansion past MAX_YAML_NODES; linear in
    the loaded (shared) structure: each distinct node is sized once."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, children_done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        items = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        if children_done:
            on_path.discard(key)
            total = 1 + sum(size.get(id(c), 1) for c in items)
            if total > MAX_YAML_NODES:
                raise UsageError(f"{source}: YAML aliases expand to more than {MAX_YAML_NODES} "
                                 "nodes; refusing the inventory")
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise UsageError(f"{source}: recursive YAML alias (a node contains itself); refusing "
                             "the inventory")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in items if isinstance(c, (dict, list)))
def _parse_yaml(text: str, source: str) -> _Inventory:
    try:
        import yaml
    except ImportError:
        raise UsageError(
            f"{source}: YAML inventories need PyYAML (pip install pyyaml), or use the INI form"
        ) from None
    try:
        # libyaml's loader when built in (10 000 hosts: ~0.2 s instead of ~1.5 s), same rules
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise UsageError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise UsageError(f"{source}: YAML nested too deeply (recursive aliases?)") from None
    _check_yaml_size(data, source)
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
            inv.add_child(name, child)
            walk(child, child_body, f"{path}.children.{child}")

    for name, body in data.items():
        walk(str(name), body, str(name))
    return inv


# --- targets from an inventory ------------------------------------------------------------------
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.:%@\[\]-]+$")


def _checked(value: Any, what: str, host: str) -> str:
    text = str(value)
    if not text or text.startswith("-") or not _SAFE_TOKEN.match(text):
        raise UsageError(f"inventory host {plain(host, 200)!r}: unsafe {what} {plain(text, 200)!r}")
    return text


def _split_args(value: Any, what: str, host: str) -> list[str]:
    text = str(value)
    if not _SHELL_SYNTAX.search(text):
        return text.split()
    try:
        return shlex.split(text)
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


_INI_HOST_VAR = re.compile(r"^ansible_[A-Za-z0-9_]+=")


def _looks_like_ini_inventory(text: str) -> bool:
    """A `[group]` header, or a `host ansible_x=...` line: a word followed only by key=value
    words, one of them an ansible_ variable. (`docker exec -i ansible_runner_1` is a prefix.)"""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if re.match(r"^\[[^\]]+\]$", line):
            return True
        words = line.split()
        if len(words) > 1 and all("=" in w for w in words[1:]) and any(
                _INI_HOST_VAR.match(w) for w in words[1:]):
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
        hosts: dict[str, None] = {}
        for group in fnmatch.filter(list(inv.groups), pattern):
            hosts.update(dict.fromkeys(inv.expand(group)))
        hosts.update(dict.fromkeys(fnmatch.filter(inv.host_order, pattern)))
        if hosts:
            return list(hosts)
    known = ", ".join(sorted(g for g in inv.groups if g not in ("ungrouped",)))
    raise UsageError(f"--limit {pattern!r}: no such group or host in {source} (groups: {known})")


def _select(inv: _Inventory, limit: str | None, source: str) -> list[str]:
    """Ansible-style --limit: `a,b` or `a:b` union, `!x` excludes, `&x` intersects, globs allowed."""
    if not limit:
        return list(inv.host_order)
    picked: dict[str, None] = {}
    words = [w.strip() for w in re.split(r"[,:]", limit) if w.strip()]
    for word in (w for w in words if w[0] not in "!&"):
        picked.update(dict.fromkeys(_match(inv, word, source)))
    chosen = list(picked)
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
    groups = inv.host_groups()
    targets = []
    for host in hosts:
        try:
            targets.append(_target_from_vars(host, inv.vars_for(host, groups[host]), groups[host]))
        except UsageError as exc:  # one bad entry is reported and skipped, not the whole fleet
            targets.append(Target(plain(host, 256), [], None, groups[host],
                                  error=f"refused: {plain(redact_text(str(exc)), 400)}"))
    return targets
