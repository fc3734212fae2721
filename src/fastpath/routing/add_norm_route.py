"""The decoder layer's residual add and the post-attention zero-centred RMSNorm after it -> one
fused Triton op (``kernels/zc_rmsnorm``'s add_zc_rmsnorm), where a decoder layer computes exactly that.

transformers' ``Qwen3_5DecoderLayer``, ``Qwen3_5MoeDecoderLayer`` and ``Qwen3NextDecoderLayer`` (every
release from 4.57 to 5.25) end their forward with::

    hidden_states = residual + hidden_states          # after the token mixer
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states) ...       # then residual + hidden_states again

The add is a pass over the activations forward, and backward autograd sums the two gradients of
its result (the norm's and the last residual add's) in another pass. ``add_zc_rmsnorm`` does the
add inside the norm's forward pass and the sum inside the norm's backward pass.

How: the class's own forward is rewritten, not re-implemented. Its source (the function a
decorator such as 5.25's ``deprecate_kwarg`` wraps) is parsed, the three statements above (this
exact text, once, at the top level of the body) become one call of this module's ``add_norm``,
and the result is compiled in the modeling module's globals with the original's file name and
line numbers (tracebacks point at transformers' lines). Every other statement is transformers'
own, so the token mixer's arguments, cache handling and MoE unpacking stay whatever the installed
release does. A decorated forward gets the same decorator chain back, each wrapper copied with the
rewritten function in place of the original in its closure. A forward whose text differs, that
holds the statements twice, reads closure variables or whose decorator does not close over the
function it wraps is not routed; explain() says why.

Per call, ``add_norm`` takes the fused op only where the separate norm would have taken
fastpath's kernel (the zero-centred norm route is on and routed the norm's class, the call fits
it, the norm module has no instance forward and no forward hooks, the residual matches x), so the
result is what the routed norm gives (the sum rounded once as torch's add, the norm computed from
it: bit for bit under the CPU interpreter; on a GPU the sum bit for bit and the norm within the 2x
rule against float64, as the GPU test checks); backward the two gradients of the sum are added in
float32 and rounded once instead of twice. Anything else runs the three original statements.

FASTPATH_ADD_NORM=auto|fastpath|torch (read by enable()). The default is torch: on an H100 the
kernel passed its GPU tests (memcheck clean) and `verify` passed with the route on, but the
8-layer Qwen3.5-27B training step measured no faster with it (22.3k tok/s against 22.8k without,
BENCHMARKS.md): the add it saves is one bandwidth-bound pass of a step of ~180 ms, within the
run-to-run spread. auto routes where the kernel imports, fastpath makes enable() fail if it does not.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import os
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from fastpath.routing import route_modes, zc_norm_route
from fastpath.routing.patch_registry import PatchRegistry

ENV_MODE = "FASTPATH_ADD_NORM"
MODES = ("auto", "fastpath", "torch")
DEFAULT_MODE = "torch"  # measured no faster in a training step (module docstring)
OP = "add_zc_rmsnorm"
IMPL = "fastpath-triton"
#: set on a routed class's forward
ROUTE_ATTR = "__fastpath_add_norm_route__"
#: set on a candidate class enable() did not route: why (one line)
SKIP_ATTR = "__fastpath_add_norm_skip__"
#: the statements replaced, in order, as ast.unparse writes them
STATEMENTS = ("hidden_states = residual + hidden_states",
              "residual = hidden_states",
              "hidden_states = self.post_attention_layernorm(hidden_states)")
_HELPER = "__fastpath_add_norm"
_REPLACEMENT = f"residual, hidden_states = {_HELPER}(self, residual, hidden_states)"

#: What enable() decided, for explain() and the routed forwards; set through the PatchRegistry so
#: disable() clears it and suspended() suspends it.
ACTIVE: AddNormStatus | None = None


@dataclass
class AddNormStatus(route_modes.RouteStatus):
    """enable()'s decision for the fused residual add + post-attention norm."""

    FAST_IMPL: ClassVar[str] = IMPL


def route_mode() -> str:
    """FASTPATH_ADD_NORM, validated (a bad value is a usage error, not a silent default)."""
    return route_modes.env_mode(ENV_MODE, MODES, DEFAULT_MODE)


def detect_add_norm() -> AddNormStatus:
    """Whether the fused add + norm can be routed to, per FASTPATH_ADD_NORM and the install."""
    mode = route_mode()
    if mode == "torch" and not os.environ.get(ENV_MODE, "").strip():
        return AddNormStatus(False, f"off by default (no faster in a measured training step); {ENV_MODE}=auto "
                                    "turns it on")
    return route_modes.detect_fused_kernel(AddNormStatus, ENV_MODE, mode, "zc_rmsnorm",
                                           "residual add + zero-centred RMSNorm")


def _chain(forward: Callable[..., Any]) -> list[Callable[..., Any]]:
    """[forward, what it wraps, ...]: the decorator chain down to the function defined in the class."""
    chain = [forward]
    while hasattr(chain[-1], "__wrapped__") and len(chain) < 8:
        chain.append(chain[-1].__wrapped__)
    return chain


def _rewritten_tree(fn: Callable[..., Any]) -> tuple[ast.Module | None, str | None]:
    """(a module defining `__fastpath_make(helper) -> the rewritten fn`, None) or (None, why)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as exc:
        return None, f"its forward's source cannot be read ({type(exc).__name__})"
    fdef = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fdef, ast.FunctionDef):
        return None, "its forward's source is not one function definition"
    texts = [ast.unparse(stmt) for stmt in fdef.body]
    starts = [i for i in range(len(texts) - 2) if tuple(texts[i:i + 3]) == STATEMENTS]
    if len(starts) != 1:
        return None, (f"its forward does not end its attention half with `{STATEMENTS[0]}` then "
                      f"`{STATEMENTS[2]}` exactly once" if not starts else "its forward holds the add + norm twice")
    i = starts[0]
    new = ast.parse(_REPLACEMENT).body[0]
    fdef.body[i:i + 3] = [ast.copy_location(new, fdef.body[i])]
    fdef.decorator_list = []
    module = ast.parse(f"def __fastpath_make({_HELPER}):\n    pass")
    maker = module.body[0]
    assert isinstance(maker, ast.FunctionDef)
    maker.body = [fdef, ast.Return(value=ast.Name(id=fdef.name, ctx=ast.Load()))]
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
    return module, None


def _with_inner(wrapper: Callable[..., Any], old: Callable[..., Any], new: Callable[..., Any]
                ) -> Callable[..., Any] | None:
    """A copy of decorator output `wrapper` that calls `new` where it called `old` (the closure
    cell holding `old`), or None when no cell holds it."""
    cells = getattr(wrapper, "__closure__", None) or ()
    if not any(c.cell_contents is old for c in cells):
        return None
    closure = tuple(types.CellType(new) if c.cell_contents is old else c for c in cells)
    assert isinstance(wrapper, types.FunctionType)  # only functions have closure cells
    copy = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__,
                              closure)
    copy.__kwdefaults__ = wrapper.__kwdefaults__
    copy.__dict__.update(wrapper.__dict__)
    copy.__qualname__, copy.__doc__, copy.__module__ = wrapper.__qualname__, wrapper.__doc__, wrapper.__module__
    copy.__wrapped__ = new  # type: ignore[attr-defined]
    return copy


def make_forward(original: Callable[..., Any]) -> tuple[Callable[..., Any] | None, str | None]:
    """(the class forward with the add + norm fused, None) or (None, why it cannot be rewritten)."""
    chain = _chain(original)
    inner = chain[-1]
    if not isinstance(inner, types.FunctionType):
        return None, "its forward is not a plain function"
    if inner.__code__.co_freevars:
        return None, "its forward reads closure variables"
    tree, why = _rewritten_tree(inner)
    if tree is None:
        return None, why
    namespace: dict[str, Any] = {}
    # the module's `from __future__ import annotations`, if any, holds for the copy too
    flags = inner.__code__.co_flags & __future__.annotations.compiler_flag
    try:
        code = compile(tree, inner.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
        exec(code, inner.__globals__, namespace)  # defines __fastpath_make only, in `namespace`
        new = namespace["__fastpath_make"](add_norm)
    except Exception as exc:
        return None, f"its rewritten forward does not build ({type(exc).__name__}: {exc})"
    new.__qualname__, new.__module__, new.__doc__ = inner.__qualname__, inner.__module__, inner.__doc__
    for wrapper, old in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
        rebuilt = _with_inner(wrapper, old, new)
        if rebuilt is None:
            return None, f"its forward's decorator ({getattr(wrapper, '__qualname__', wrapper)}) cannot be rebuilt"
        new = rebuilt
    setattr(new, ROUTE_ATTR, True)
    return new, None


def _routed_norm_eps(norm: Any) -> str | None:
    """The eps attribute of a post-attention norm whose own call would take fastpath's zero-centred
    norm kernel (its class routed, no instance forward, no forward hooks), else None."""
    import torch

    zc = zc_norm_route.ACTIVE
    if zc is None or not zc.route or not isinstance(norm, torch.nn.Module) or "forward" in vars(norm):
        return None
    from torch.nn.modules import module as nn_module

    if (norm._forward_hooks or norm._forward_pre_hooks or nn_module._global_forward_hooks
            or nn_module._global_forward_pre_hooks):
        return None
    return getattr(type(norm).forward, zc_norm_route.ROUTE_ATTR, None)


def add_norm(layer: Any, residual: Any, x: Any) -> tuple[Any, Any]:
    """The rewritten forward's `residual + x` and its post-attention norm: (sum, normed)."""
    active = ACTIVE
    norm = layer.post_attention_layernorm
    eps_attr = _routed_norm_eps(norm) if active is not None and active.route else None
    if (eps_attr is not None and zc_norm_route.fits(norm, x) and type(residual) is type(x)
            and residual.shape == x.shape and residual.dtype == x.dtype and residual.device == x.device):
        from fastpath.kernels.zc_rmsnorm.interface import add_zc_rmsnorm

        return add_zc_rmsnorm(x, residual, norm.weight, float(getattr(norm, eps_attr)))
    hidden_states = residual + x
    return hidden_states, norm(hidden_states)


def candidates(module: ModuleType) -> list[type]:
    """The decoder-layer classes defined in `module` (the rewrite then decides)."""
    import torch

    return [obj for obj in list(vars(module).values())
            if isinstance(obj, type) and obj.__module__ == module.__name__ and obj.__name__.endswith("DecoderLayer")
            and issubclass(obj, torch.nn.Module) and "forward" in obj.__dict__]


def patch_module(module: ModuleType, status: AddNormStatus, reg: PatchRegistry) -> list[str]:
    """Route the decoder layers of one modeling module whose forward holds the add + norm (with the
    route off, every candidate is marked with the reason, for explain())."""
    for cls, original in route_modes.classes_to_route(candidates(module), status, reg, ROUTE_ATTR, SKIP_ATTR):
        forward, why = make_forward(original)
        if forward is None:
            reg.set_attr(cls, SKIP_ATTR, why)
            continue
        reg.set_attr(cls, "forward", forward)
    return []


def describe_layer(layer: Any, device: str) -> tuple[str, bool] | None:
    """explain()'s (impl, fast) for a decoder layer with a zero-centred post-attention norm while
    the route is on, else None: with it off, the add stays torch's and the norm is still the norm
    route's, so a layer has no slow path to report (enable()'s summary says the route is off)."""
    norm = getattr(layer, "post_attention_layernorm", None)
    if ACTIVE is None or not ACTIVE.route or norm is None or not zc_norm_route.is_candidate(type(norm)):
        return None
    found = route_modes.describe_routed_class(layer, device, IMPL, ROUTE_ATTR, SKIP_ATTR)
    if found is not None and found[1] and _routed_norm_eps(norm) is None:
        return "torch (its post_attention_layernorm does not take fastpath's zero-centred norm)", False
    return found
