"""Model plan: for each layer type of a config, which implementation each kernel op resolves to.

Computed from FACTS only (transformers version, package import states, CUDA availability, env),
never by importing transformers here, so the same code plans for a remote target. The version
rules follow transformers' own code (src/transformers/utils/import_utils.py `is_causal_conv1d_available`
at v4.57.6, src/transformers/integrations/hub_kernels.py at v5.14.0, v5.15.0 and v5.25.0):
- <= 5.14: module-level imports; the compiled package must import AND torch must see CUDA
  (4.57 also needs dist-info metadata for causal_conv1d). Mamba families load causal-conv1d via
  `lazy_load_kernel`: with `kernels` installed only the hub is tried.
- 5.15+: `use_kernel_func_from_hub_with_fallback` imports the package once; no CUDA check.
- 5.25+: `kernels` is a dependency and from_pretrained defaults to use_kernels=True (hub
  downloads) unless USE_HUB_KERNELS=0. A Hub kernel counts as fast only when a build for this
  environment is already in the local cache (fastpath.doctor.hub_kernels decides).
Mamba-style families are all-or-nothing: one missing op sends every op to the torch path.
An op is `fast` when it runs a fast kernel as transformers loads the model, `with_fastpath_fast`
when it does after fastpath.enable(); `device_bound` / `with_fastpath_device_bound` mark a slow op
whose only reason is that no GPU is here (the doctor then cannot judge it).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from fastpath.doctor.facts import FactsView, view
from fastpath.doctor.families import Family, Op, family_for
from fastpath.doctor.hub_kernels import (
    CACHED,
    HUB_MAPPED_525,
    OFFLINE_NO_BUILD,
    hub_status,
    hub_status_for_op,
)
from fastpath.shared.errors import UsageError
from fastpath.shared.known_issues import MAMBA_PR_977, mamba1_cuda_scan_missing, parse_version
from fastpath.shared.model_source import text_config

FAST = "fast-kernel"
HUB = "hub-kernel"
FALLBACK = "torch-fallback"
UNSUPPORTED = "unsupported"
RAISES = "raises-when-called"
# Why an op is slow when the only reason is that no GPU is here (or assumed).
NEEDS_GPU = "needs a GPU"
NO_CUDA_DEVICE = "torch sees no CUDA device (is_*_available() needs it)"
# Mamba-1 ops that call mamba_ssm's selective_scan_cuda extension.
MAMBA1_CUDA_SCAN_OPS = ("selective_scan_fn", "mamba_inner_fn")

# Representative releases for "what would each transformers range do" (no transformers here).
VERSION_RANGES: tuple[tuple[str, str], ...] = (
    ("4.57.x", "4.57.6"),
    ("5.0-5.14", "5.14.0"),
    ("5.15-5.16", "5.15.0"),
    ("5.17-5.24", "5.17.0"),
    (">=5.25", "5.25.0"),
)

# <= 5.14 Mamba family: lazy_load_kernel("causal-conv1d") -> _HUB_KERNEL_MAPPING
HUB_CAUSAL_CONV1D_514 = "kernels-community/causal-conv1d"


# What installs each kernel distribution (the after-enable column names it when it is missing).
INSTALL = {
    "flash-linear-attention": ("fla-core", "pip install fla-core"),
    "causal-conv1d": ("causal-conv1d", "pip install causal-conv1d --no-build-isolation"),
    "mamba-ssm": ("mamba-ssm", "pip install mamba-ssm --no-build-isolation"),
}


def hub_kernel_525(op: Op, tv: Version, fv: FactsView, hub_on: bool) -> bool:
    """transformers >= 5.25 with `kernels` installed and Hub kernels on: from_pretrained
    kernelizes `op` with a Hub kernel (its default use_kernels=True)."""
    return (tv >= Version("5.25") and fv.package_ok("kernels") and hub_on
            and op.name in HUB_MAPPED_525)


def _hub_row(op: Op, fv: FactsView) -> dict[str, Any] | None:
    """The row of a Hub-kernelized op (None when, offline, the cached version has no build here:
    kernelize then keeps transformers' own path, resolved below)."""
    st = hub_status_for_op(fv, op.name)
    if st is None or st.state == OFFLINE_NO_BUILD:
        return None
    return {"impl": HUB, "reason": st.label, "hub": st.to_json()}


def mamba1_scan_raises(op: Op, fv: FactsView) -> bool:
    """transformers picks mamba_ssm's Mamba-1 scan for `op`, which raises when called: the
    package imports without its selective_scan_cuda extension (known_issues decides)."""
    return op.name in MAMBA1_CUDA_SCAN_OPS and op.dist == "mamba-ssm" and mamba1_cuda_scan_missing(
        fv.package_ok("mamba-ssm"), fv.extension_module("mamba-ssm", "selective_scan_cuda"))


def resolve_op(op: Op, fam: Family, tv: Version, fv: FactsView) -> dict[str, Any]:
    """Which implementation transformers `tv` picks for `op` on this host (before all-or-nothing)."""
    ok = fv.package_ok(op.dist)
    cuda = fv.cuda_visible
    kernels = fv.package_ok("kernels")
    hub_on = fv.hub_kernels_enabled
    mamba_style = fam.all_or_nothing
    if hub_kernel_525(op, tv, fv, hub_on):
        row = _hub_row(op, fv)
        if row is not None:
            return row
    if ok and mamba1_scan_raises(op, fv):
        return {"impl": RAISES, "reason": "mamba_ssm imports without its selective_scan_cuda "
                f"extension: {op.name} raises when called ({MAMBA_PR_977})"}
    if tv < Version("5.15"):
        if mamba_style and op.dist == "causal-conv1d" and kernels and tv >= Version("5.0") and (
                hub_on or tv < Version("5.14")):
            st = hub_status(fv, HUB_CAUSAL_CONV1D_514, None)
            return {"impl": HUB, "hub": st.to_json(), "reason": "lazy_load_kernel('causal-conv1d') "
                    f"with `kernels` installed tries only {HUB_CAUSAL_CONV1D_514} (local package "
                    f"ignored): {st.label}"}
        if not ok:
            return {"impl": FALLBACK, "reason": f"{op.module} not importable"}
        if cuda is False:
            return {"impl": FALLBACK, "reason": NO_CUDA_DEVICE, "device_bound": not fv.gpu_present}
        if tv < Version("5.0") and op.dist == "causal-conv1d" and not fv.package_version(op.dist):
            return {"impl": FALLBACK, "reason": "4.57 needs causal-conv1d dist metadata"}
        return {"impl": FAST, "reason": f"{op.module} imports"}
    if not ok:
        return {"impl": FALLBACK, "reason": f"{op.module} not importable"}
    return {"impl": FAST, "reason": f"{op.module} imports"}


def _needs_a_device(fv: FactsView) -> str:
    if not fv.gpu_present:
        return NEEDS_GPU
    if not fv.torch_cuda:
        return "needs a CUDA build of torch"
    if fv.torch_arch_covered is False:
        return f"needs a torch build for {fv.sm}"
    return "needs Triton with a GPU backend: pip install triton"


def after_enable(op: Op, impl: str, tv: Version, fv: FactsView) -> tuple[str, str | None, str]:
    """(implementation after fastpath.enable(), what it still needs or None when it runs fast,
    who serves the op then: "fastpath" | "hub" | "package" | "torch").

    What enable() does, read from the same facts explain() would see after it: Hub kernels stay
    on only where the user set USE_HUB_KERNELS (fastpath.shared.hub_kernels_env decides, for both);
    causal_conv1d goes to fastpath even next to a working Dao package (routing/modeling_patch.py
    patches every modeling module); the other ops fastpath routes (families.Op.fastpath: the
    Mamba-2 ones) go there unless their package works (routing/ssd_route.py, mamba_ssm="auto")."""
    if hub_kernel_525(op, tv, fv, fv.hub_kernels_after_enable):
        row = _hub_row(op, fv)
        if row is not None:
            return HUB, None if row["hub"]["state"] == CACHED else row["reason"], "hub"
    if impl == HUB:  # the Hub kernel is off after enable(): transformers imports the package
        impl = FAST if fv.package_ok(op.dist) else FALLBACK
        if impl == FAST and mamba1_scan_raises(op, fv):
            impl = RAISES
    if op.fastpath and (op.dist == "causal-conv1d" or impl != FAST):
        if fv.fastpath_route_available and fv.gpu_present and fv.torch_arch_covered is not False:
            return "fastpath-triton", None, "fastpath"
        return FALLBACK, _needs_a_device(fv), "fastpath"
    if impl == FAST:
        return impl, None, "package"
    if not fv.package_ok(op.dist):
        name, cmd = INSTALL.get(op.dist, (op.dist, f"pip install {op.dist}"))
        return FALLBACK, f"needs {name}: {cmd}", "torch"
    return FALLBACK, _needs_a_device(fv), "package"


def plan_for_version(config: dict[str, Any], fam: Family, tv: Version,
                     facts: dict[str, Any] | FactsView) -> dict[str, Any]:
    fv = view(facts)
    text = text_config(config)
    try:
        layers = fam.layers(text)
    except (TypeError, ValueError, AttributeError) as exc:
        layers, why = [], f"{type(exc).__name__}: {exc}"
    else:
        why = "no layers"
    if not layers:
        raise UsageError(f"cannot read the layer layout of this {text.get('model_type')} config "
                         f"(num_hidden_layers / layer_types / the family's pattern field): {why}")
    counts: dict[str, int] = {}
    for lt in layers:
        counts[lt] = counts.get(lt, 0) + 1
    if fam.min_transformers and tv < Version(fam.min_transformers):
        return {"transformers": str(tv), "supported": False, "layers_total": len(layers),
                "layers_slow": None, "layer_types": [], "summary": [
                    f"transformers {tv} has no {text.get('model_type')} model "
                    f"(added in {fam.min_transformers})"]}
    out_types = []
    for lt, n in counts.items():
        ops = fam.ops_by_layer.get(lt, ())
        rows = [dict(op=op.name, dist=op.dist, **resolve_op(op, fam, tv, fv)) for op in ops]
        if fam.all_or_nothing and any(r["impl"] == FALLBACK for r in rows):
            missing = sorted({r["dist"] for r in rows if r["impl"] == FALLBACK})
            bound = all(r.get("device_bound") for r in rows if r["impl"] == FALLBACK)
            for r in rows:
                if r["impl"] not in (FALLBACK, HUB):  # a Hub kernel is not in the package gate
                    r["impl"], r["device_bound"] = FALLBACK, bound
                    r["reason"] = f"all-or-nothing fast path: {', '.join(missing)} missing"
        for r, op in zip(rows, ops, strict=True):
            r["fast"] = r["impl"] == FAST or (
                r["impl"] == HUB and (r.get("hub") or {}).get("state") == CACHED)
            r["device_bound"] = bool(r.get("device_bound")) and not r["fast"]
            r["with_fastpath"], r["with_fastpath_needs"], r["with_fastpath_by"] = after_enable(
                op, r["impl"], tv, fv)
            r["with_fastpath_device_bound"] = r["with_fastpath_needs"] == NEEDS_GPU
        if fam.all_or_nothing and any(r["with_fastpath"] == FALLBACK for r in rows):
            failing = [r for r in rows if r["with_fastpath"] == FALLBACK and r["with_fastpath_needs"]]
            missing = sorted({r["with_fastpath_needs"] for r in failing})
            bound = all(r["with_fastpath_device_bound"] for r in failing)
            for r in rows:
                if r["with_fastpath"] not in (FAST, FALLBACK, HUB):
                    r["with_fastpath"], r["with_fastpath_by"] = FALLBACK, "torch"
                    r["with_fastpath_needs"] = "all-or-nothing: " + "; ".join(missing)
                    r["with_fastpath_device_bound"] = bound
        for r in rows:
            r["with_fastpath_fast"] = r["with_fastpath_needs"] is None
        out_types.append({"layer_type": lt, "count": n, "ops": rows,
                          "slow": any(not r["fast"] for r in rows),
                          "slow_with_fastpath": any(not r["with_fastpath_fast"] for r in rows)})
    total = len(layers)
    slow = sum(t["count"] for t in out_types if t["slow"])
    summary = []
    for t in out_types:
        for r in t["ops"]:
            if r["impl"] == FALLBACK:
                summary.append(f"{t['count']} of {total} layers take the torch fallback for "
                               f"{r['op']} ({r['reason']})")
            elif r["impl"] == RAISES:
                summary.append(f"{t['count']} of {total} layers call {r['op']}, which raises "
                               f"({r['reason']})")
            elif r["impl"] == HUB:
                summary.append(f"{t['count']} of {total} layers use a hub kernel for {r['op']}: "
                               f"{r['reason']}")
    slow_after = sum(t["count"] for t in out_types if t["slow_with_fastpath"])
    return {"transformers": str(tv), "supported": True, "layers_total": total,
            "layers_slow": slow, "layers_slow_with_fastpath": slow_after,
            "layer_types": out_types, "summary": summary}


def range_start(label: str) -> str:
    """The first release of a VERSION_RANGES label: '5.0-5.14' -> '5.0', '>=5.25' -> '5.25',
    '4.57.x' -> '4.57'."""
    return label.removeprefix(">=").split("-")[0].removesuffix(".x")


def _from_first_release(label: str, rep: str, first: str | None) -> str:
    """A range's label starting at the family's first release when that falls inside it
    ('5.0-5.14' becomes '5.2-5.14' for Qwen3.5): the plan of the range's representative
    version does not hold for the releases before the model existed."""
    start = range_start(label)
    if not first or not Version(start) < Version(first) <= Version(rep):
        return label
    major_minor = ".".join(first.split(".")[:2])
    return f">={major_minor}" if label.startswith(">=") else f"{major_minor}-{label.split('-')[-1]}"


def plan_model(config: dict[str, Any], facts: dict[str, Any] | FactsView,
               label: str = "") -> dict[str, Any]:
    """The model plan for the transformers in `facts` (or per version range if it is absent)."""
    fv = view(facts)
    text = text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    fam = family_for(model_type) or family_for(str(config.get("model_type") or ""))
    base: dict[str, Any] = {"model": label or model_type, "model_type": model_type,
                            "family": fam.name if fam else None,
                            "all_or_nothing": bool(fam and fam.all_or_nothing),
                            "family_note": fam.note if fam else ""}
    if fam is None:
        layers = text.get("num_hidden_layers")
        tv_text = fv.package_version("transformers")
        under = (f"under transformers {tv_text}" if tv_text else
                 "in any transformers release fastpath knows (transformers is not installed here)")
        base.update({"transformers": tv_text, "supported": True,
                     "layers_total": layers if isinstance(layers, int) else 0,
                     "layers_slow": 0, "layer_types": [], "by_version": [],
                     "summary": [f"no kernel ops in {model_type or 'this model'} {under}: "
                                 "nothing for fastpath to fix"]})
        return base
    tv = parse_version(fv.package_version("transformers"))
    if tv is not None:
        base.update(plan_for_version(config, fam, tv, fv))
        base["by_version"] = []
        return base
    by_version = []
    for label_range, rep in VERSION_RANGES:
        p = plan_for_version(config, fam, Version(rep), fv)
        p["range"] = _from_first_release(label_range, rep, fam.min_transformers)
        by_version.append(p)
    first = by_version[-1]
    base.update({"transformers": None, "supported": first["supported"],
                 "layers_total": first["layers_total"], "layers_slow": first["layers_slow"],
                 "layers_slow_with_fastpath": first.get("layers_slow_with_fastpath"),
                 "layer_types": first["layer_types"], "by_version": by_version,
                 "summary": ["transformers is not installed here: showing what each release "
                             "range would do with these packages"]})
    return base
