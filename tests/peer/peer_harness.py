"""What the peer-suite conftest does, as plain functions: find mamba_ssm's own test files, load
mamba_ssm from source without its CUDA extensions, widen a test file's parametrize lists to the
values it leaves commented out, and put fastpath's functions in place of the ones under test.

Nothing here copies upstream code: the test files are read from the path the user gives
(MAMBA_PEER_TESTS) and compiled in memory; mamba_ssm is imported from MAMBA_SRC.
Upstream: https://github.com/state-spaces/mamba (tests/ops/test_selective_scan.py,
tests/ops/triton/test_selective_state_update.py, tests/ops/triton/test_ssd.py).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import itertools
import os
import sys
import tokenize
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import float64_judge as judge

TESTS_ENV = "MAMBA_PEER_TESTS"  # a state-spaces/mamba checkout (holds tests/ops/...)
SRC_ENV = "MAMBA_SRC"  # the folder holding mamba_ssm/ (the unpacked PyPI sdist, or the checkout)
GRID_ENV = "PEER_GRID"  # "default" (the file as written) or "wide" (commented-out values too)
DEVICE_ENV = "PEER_DEVICE"  # "cuda" (default); "cpu" only as a smoke check under TRITON_INTERPRET=1
SHARD_ENV = "PEER_SHARD"  # "i/n": run every n-th upstream case starting at i (parallel processes)
DONE_ENV = "PEER_DONE"  # a file of node ids: those are not run again, each finished one is added


# ---------------------------------------------------------------- the suites
def _scan_fn():
    from fastpath.kernels.selective_scan.interface import selective_scan_fn

    return selective_scan_fn


def _inner_fn():
    from fastpath.kernels.selective_scan.inner import mamba_inner_fn

    return mamba_inner_fn


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    """mamba_ssm's one `selective_state_update` name serves both models: a 3-D state is the
    Mamba-1 step (fastpath.kernels.selective_scan.update, what the Mamba-1 routes use), a 4-D
    state (with heads) the Mamba-2 step (fastpath.kernels.ssd.update)."""
    if state.dim() == 4:
        from fastpath.kernels.ssd.update import selective_state_update as step
    else:
        from fastpath.kernels.selective_scan.update import selective_state_update as step
    return step(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                state_batch_indices=state_batch_indices)


def chunk_state_varlen(B, x, dt, dA_cumsum, cu_seqlens, chunk_states):
    """test_ssd.py's only test calls mamba_ssm's internal `chunk_state_varlen` (the final state of
    every packed sequence, what `mamba_chunk_scan_combined(..., cu_seqlens=...,
    return_varlen_states=True)` returns). This answers the same question through fastpath's public
    `mamba_chunk_scan_combined`: the token dt is read back from the chunked dt the test passes,
    A from dA_cumsum / dt at each chunk's first step; `chunk_states` (upstream's intermediate) is
    not used. Upstream's `_chunk_cumsum_fwd` / `_chunk_state_fwd` / `_state_passing_fwd` /
    `chunk_state` stay the judge.

    The public function returns the varlen states in C's dtype (as mamba_ssm's does); the
    internal one the test calls returns them in `chunk_states`' dtype (float32 here). C's values
    are not read for the states, so C is passed in that dtype: the states come back unrounded,
    as the test asks (a 16-bit C would add one rounding of the result, ~1.4x the error)."""
    import torch

    from fastpath.kernels.ssd import mamba_chunk_scan_combined

    total = x.shape[0]
    nheads, _, chunk = dt.shape
    A = dA_cumsum[:, 0, 0] / dt[:, 0, 0]
    dt_tokens = dt.permute(1, 2, 0).reshape(-1, nheads)[:total]
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    seq_idx = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths)
    _, states = mamba_chunk_scan_combined(
        x[None], dt_tokens[None], A, B[None], B[None].to(chunk_states.dtype), chunk,
        seq_idx=seq_idx[None].to(torch.int32), cu_seqlens=cu_seqlens, return_varlen_states=True,
    )
    return states.to(chunk_states.dtype)


# ---------------------------------------------------------------- the float64 judge's references
def with_batch_indices(reference: Callable) -> Callable:
    """mamba_ssm's `selective_state_update_ref` takes the state rows of the batch; the function
    under test takes the whole pool and `state_batch_indices`. The same call, answered by the
    reference on the rows the indices pick (written back in place, as the function does)."""

    def run(state, *args, state_batch_indices=None, **kwargs):
        if state_batch_indices is None:
            return reference(state, *args, **kwargs)
        rows = state_batch_indices.long()
        picked = state[rows].clone()
        out = reference(picked, *args, **kwargs)
        state[rows] = picked
        return out

    return run


def chunk_state_varlen_float64(chunk_state_ref: Callable) -> Callable:
    """The final state of every packed sequence from scratch, through mamba_ssm's pure-torch
    `chunk_state_ref` (one chunk spanning the whole sequence, zero initial state), on the call's
    inputs in float64. The per-token log-decay is the step of the given within-chunk cumulative
    sums (exactly what the kernels difference); `chunk_states`, upstream's intermediate, is not
    an input of the exact answer."""

    def run(B, x, dt, dA_cumsum, cu_seqlens, chunk_states):
        import torch
        import torch.nn.functional as F

        total, nheads = x.shape[0], x.shape[1]
        steps = dA_cumsum - F.pad(dA_cumsum[..., :-1], (1, 0))
        tokens = lambda t: t.permute(1, 2, 0).reshape(-1, nheads)[:total]  # noqa: E731
        dt_tok, step_tok = tokens(dt), tokens(steps)
        bounds = cu_seqlens.tolist()
        out = []
        for start, end in itertools.pairwise(bounds):
            dt_s = dt_tok[start:end].T[None, :, None, :]  # (1, H, 1 chunk, length)
            cum = step_tok[start:end].cumsum(0).T[None, :, None, :]
            states = chunk_state_ref(B[start:end][None], x[start:end][None], dt_s, cum)
            out.append(states[0, 0])
        return torch.stack(out)

    return run


@dataclass(frozen=True)
class JudgeSpec:
    """How the float64 judge finds its references for one name under test: `reference` names
    the same-dtype reference in the test module (the name under test itself means upstream's
    original of it); `adapt` wraps it to take the call's arguments; `exact(module)` gives the
    float64 run when it is not the reference itself (None if the module lacks what it needs);
    `mutated` the parameters the function updates in place."""

    reference: str
    adapt: Callable[[Callable], Callable] | None = None
    exact: Callable[[types.ModuleType], Callable | None] | None = None
    mutated: tuple[str, ...] = ()


def _judges(**specs: JudgeSpec) -> Callable[[types.ModuleType, dict, dict], dict]:
    """A Suite.judges factory. A name whose references the test module does not hold gets no
    judge (its failures stay failures)."""

    def make(module: types.ModuleType, originals: dict, fast: dict) -> dict:
        out = {}
        for name, spec in specs.items():
            ref = (originals.get(name) if spec.reference == name
                   else module.__dict__.get(spec.reference))
            exact = spec.exact(module) if spec.exact else None
            if name not in fast or ref is None or (spec.exact and exact is None):
                continue
            out[name] = judge.Judge(fast[name], spec.adapt(ref) if spec.adapt else ref, exact,
                                    spec.mutated)
        return out

    return make


def _varlen_float64(module: types.ModuleType) -> Callable | None:
    ref = module.__dict__.get("chunk_state_ref")
    return chunk_state_varlen_float64(ref) if ref is not None else None


@dataclass(frozen=True)
class Suite:
    """One upstream test file and what the harness puts in place in it.

    test_names: names in the test module's namespace -> fastpath's function (a zero-argument
    factory, so fastpath is imported only when the suite is loaded).
    library_names: (mamba_ssm module, name) -> replacement inside mamba_ssm itself, for a
    reference that would otherwise call the missing CUDA extension.
    judges: (test module, upstream's originals of test_names, fastpath's functions) -> the
    float64 judge (float64_judge.Judge) of each name under test.
    """

    path: str
    test_names: dict[str, Callable[[], object]]
    library_names: dict[tuple[str, str], Callable[[types.ModuleType], object]] = field(
        default_factory=dict)
    judges: Callable[[types.ModuleType, dict, dict], dict] | None = None


SUITES = (
    Suite(
        "tests/ops/test_selective_scan.py",
        {"selective_scan_fn": _scan_fn, "mamba_inner_fn": _inner_fn},
        # mamba_inner_ref ends in the module's selective_scan_fn (the CUDA extension upstream):
        # here it is upstream's own pure-torch selective_scan_ref, so the judge is all upstream.
        {("mamba_ssm.ops.selective_scan_interface", "selective_scan_fn"):
            lambda mod: mod.selective_scan_ref},
        _judges(selective_scan_fn=JudgeSpec("selective_scan_ref"),
                mamba_inner_fn=JudgeSpec("mamba_inner_ref")),
    ),
    Suite(
        "tests/ops/triton/test_selective_state_update.py",
        {"selective_state_update": lambda: selective_state_update},
        judges=_judges(selective_state_update=JudgeSpec(
            "selective_state_update_ref", adapt=with_batch_indices, mutated=("state",))),
    ),
    Suite(
        "tests/ops/triton/test_ssd.py",
        {"chunk_state_varlen": lambda: chunk_state_varlen},
        # the same-dtype reference is upstream's own chunk_state_varlen (the name swapped out)
        judges=_judges(chunk_state_varlen=JudgeSpec("chunk_state_varlen",
                                                     exact=_varlen_float64)),
    ),
)


# ---------------------------------------------------------------- where the upstream files are
@dataclass(frozen=True)
class Upstream:
    tests: Path  # holds tests/ops/...
    src: Path  # holds mamba_ssm/
    origin: str  # what UPSTREAM says (repository and commit), or the folder


def find_upstream(environ: os._Environ | dict = os.environ) -> tuple[Upstream | None, str]:
    """(Upstream, "") or (None, the one reason the suites cannot run)."""
    tests = environ.get(TESTS_ENV)
    if not tests:
        return None, (f"set {TESTS_ENV} to a state-spaces/mamba checkout (the folder holding "
                      "tests/ops/; benchmarks/device/pack_peer_tests.sh packs one into "
                      ".carry/mamba_peer) to run mamba_ssm's own op tests against fastpath")
    root = Path(tests).expanduser().resolve()
    missing = [s.path for s in SUITES if not (root / s.path).is_file()]
    if missing:
        return None, f"{TESTS_ENV}={root} lacks {', '.join(missing)}"
    src = Path(environ.get(SRC_ENV) or root).expanduser().resolve()
    if not (src / "mamba_ssm" / "ops" / "selective_scan_interface.py").is_file():
        return None, (f"{src} holds no mamba_ssm/ source (set {SRC_ENV} to the folder holding "
                      "mamba_ssm/, e.g. the unpacked PyPI sdist mamba_ssm-2.3.2.post1)")
    stamp = root / "UPSTREAM"
    origin = stamp.read_text().strip() if stamp.is_file() else str(root)
    return Upstream(root, src, origin), ""


def grid() -> str:
    value = os.environ.get(GRID_ENV, "default")
    if value not in ("default", "wide"):
        raise ValueError(f"{GRID_ENV} must be 'default' or 'wide', got {value!r}")
    return value


def device() -> str:
    value = os.environ.get(DEVICE_ENV, "cuda")
    if value not in ("cuda", "cpu"):
        raise ValueError(f"{DEVICE_ENV} must be 'cuda' or 'cpu', got {value!r}")
    return value


def shard() -> tuple[int, int]:
    value = os.environ.get(SHARD_ENV, "0/1")
    try:
        index, count = (int(v) for v in value.split("/"))
    except ValueError:
        raise ValueError(f"{SHARD_ENV} must be 'i/n', got {value!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"{SHARD_ENV}: need 0 <= i < n, got {value!r}")
    return index, count


# ---------------------------------------------------------------- mamba_ssm without CUDA extensions
class _MissingExtension(types.ModuleType):
    """Stands in for mamba_ssm's compiled `selective_scan_cuda`: importable, unusable."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"selective_scan_cuda.{name}: mamba_ssm's CUDA extension is not built "
                             "here; the peer harness swaps its callers for fastpath's functions")


@contextlib.contextmanager
def mamba_ssm_importable(src: Path) -> Iterator[None]:
    """While inside: `import mamba_ssm.<module>` reads `src`, skipping the package root (it imports
    the CUDA extension), `selective_scan_cuda` is a stub and `causal_conv1d` is
    fastpath.causal_conv1d. On exit sys.modules is as before (the loaded modules stay alive through
    the test modules that hold them), so other tests in the process see no mamba_ssm."""
    import fastpath.causal_conv1d as face

    before = dict(sys.modules)
    packages = ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils")
    try:
        for package in packages:
            empty = types.ModuleType(package)
            empty.__path__ = [str(src.joinpath(*package.split(".")))]
            sys.modules[package] = empty
        sys.modules["selective_scan_cuda"] = _MissingExtension("selective_scan_cuda")
        sys.modules["causal_conv1d"] = face
        for sub in ("causal_conv1d_interface", "cpp_functions", "causal_conv1d_varlen"):
            sys.modules[f"causal_conv1d.{sub}"] = importlib.import_module(
                f"fastpath.causal_conv1d.{sub}")
        yield
    finally:
        for name in list(sys.modules):
            if name not in before:
                top = name.split(".")[0]
                if top in ("mamba_ssm", "selective_scan_cuda", "causal_conv1d"):
                    del sys.modules[name]
        for name, module in before.items():
            sys.modules[name] = module


# ---------------------------------------------------------------- the widened grid
@dataclass
class GridChange:
    function: str
    argnames: str
    default: int  # values in the active decorator
    wide: int  # after adding the commented-out ones
    unused: list[str] = field(default_factory=list)  # commented lists for names not parametrized


def _parametrize_call(node: ast.AST) -> tuple[str, ast.List | ast.Tuple] | None:
    """('argnames', values node) of `pytest.mark.parametrize("argnames", [...])`, else None."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.parametrize"):
        return None
    if len(node.args) < 2 or not isinstance(node.args[0], ast.Constant):
        return None
    values = node.args[1]
    if not isinstance(values, (ast.List, ast.Tuple)):
        return None
    return str(node.args[0].value), values


def _comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def widen(tree: ast.Module, source: str) -> list[GridChange]:
    """Rewrite, in place, each test function's parametrize lists to the union of the active list
    and every list the file leaves commented out for the same argnames between the function's
    decorators (the longest list first, in its order; then any value it lacks). Values are
    compared as source text (`2048 + 16` is one value)."""
    comments = _comments(source)
    changes = []
    previous_end = 0
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            previous_end = node.end_lineno or previous_end
            continue
        commented: dict[str, list[list[ast.expr]]] = {}
        for line in range(previous_end + 1, node.lineno):
            text = comments.get(line, "")
            if not text.startswith("@"):
                continue
            try:
                parsed = _parametrize_call(ast.parse(text[1:], mode="eval").body)
            except SyntaxError:
                continue
            if parsed:
                commented.setdefault(parsed[0], []).append(list(parsed[1].elts))
        active = {}
        for deco in node.decorator_list:
            parsed = _parametrize_call(deco)
            if parsed:
                active[parsed[0]] = parsed[1]
        for argnames, values in active.items():
            lists = [list(values.elts), *commented.pop(argnames, [])]
            merged: list[ast.expr] = []
            seen = set()
            for elt in (e for lst in sorted(lists, key=len, reverse=True) for e in lst):
                key = ast.dump(elt)
                if key not in seen:
                    seen.add(key)
                    merged.append(elt)
            changes.append(GridChange(node.name, argnames, len(values.elts), len(merged)))
            values.elts = merged
        for argnames in commented:  # a commented list for a name the function does not vary
            changes.append(GridChange(node.name, argnames, 0, 0, unused=[argnames]))
        previous_end = node.end_lineno or node.lineno
    return changes


class _OnDevice(ast.NodeTransformer):
    """`device = 'cuda'` -> `device = '<PEER_DEVICE>'` (the upstream tests hard-code the GPU)."""

    def __init__(self, target: str):
        self.target = target

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        if (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "device" and isinstance(node.value, ast.Constant)
                and node.value.value == "cuda"):
            node.value = ast.copy_location(ast.Constant(self.target), node.value)
        return node


def compile_suite(path: Path, wide: bool, on: str) -> tuple[types.CodeType, list[GridChange]]:
    """The upstream file compiled in memory (its own file name in tracebacks)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    changes = widen(tree, source) if wide else []
    if on != "cuda":
        tree = _OnDevice(on).visit(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec"), changes


def load_suite(suite: Suite, upstream: Upstream, wide: bool, on: str) -> tuple[types.ModuleType,
                                                                               list[GridChange]]:
    """Import one upstream test file against fastpath: the names under test are fastpath's, the
    rest (references, helpers) upstream's."""
    path = upstream.tests / suite.path
    code, changes = compile_suite(path, wide, on)
    name = "mamba_peer." + suite.path.removesuffix(".py").replace("/", ".")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    with mamba_ssm_importable(upstream.src):
        for (lib, attr), replacement in suite.library_names.items():
            lib_module = importlib.import_module(lib)
            setattr(lib_module, attr, replacement(lib_module))
        exec(code, module.__dict__)
    originals, fast = {}, {}
    for attr, factory in suite.test_names.items():
        if attr not in module.__dict__:
            raise RuntimeError(f"{path} no longer defines {attr}; update tests/peer/peer_harness.py")
        originals[attr], fast[attr] = module.__dict__[attr], factory()
    judges = suite.judges(module, originals, fast) if suite.judges else {}
    for attr, fn in fast.items():
        mutated = judges[attr].mutated if attr in judges else ()
        module.__dict__[attr] = judge.recording(attr, fn, mutated) if attr in judges else fn
    tree = ast.parse(path.read_text())
    grad_tests = frozenset(node.name for node in tree.body
                           if isinstance(node, ast.FunctionDef) and judge.asserts_gradients(node))
    module.__peer_judges__ = judge.SuiteJudges(judges, grad_tests, str(path))
    return module, changes
