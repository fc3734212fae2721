"""Known-bad combinations as DATA: each Rule = a check over the facts (+ model plan), a detail
template, concrete remedies and the source of the fact. Adding a rule = one RULES entry.

Remedy order matters: whenever it applies (Triton has a GPU backend here, or can be installed
next to a CUDA torch, and the model's family uses causal_conv1d), fastpath's compiler-free route
is named FIRST; the CUDA-toolkit route comes after it, pinned to torch's CUDA major.minor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from fastpath.doctor.facts import FactsView, view
from fastpath.doctor.gpu_models import AssumedGpu
from fastpath.doctor.hub_kernels import (
    CACHED,
    FLA_REPO,
    HUB_MAPPED_525,
    OFFLINE_MISSING,
    OFFLINE_NO_BUILD,
    TRANSFORMERS_HUB_SOURCE,
    HubStatus,
    hub_status,
)
from fastpath.doctor.plan import FALLBACK, INSTALL, MAMBA1_CUDA_SCAN_OPS, hub_kernel_525
from fastpath.doctor.probe import arch_runs_on
from fastpath.shared.known_issues import (
    MAMBA_PR_977,
    SPECULATORS_NORM_SOURCES,
    ZERO_CENTRED_FINAL_NORM,
    dao_sm103_nvcc13,
    fla_640,
    host_gcc_unsupported,
    mamba1_cuda_scan_missing,
    speculators_zero_centred_norm,
)
from fastpath.shared.liger_families import MEASURED_EFFECT as LIGER_EFFECT
from fastpath.shared.liger_families import MIN_TRANSFORMERS as LIGER_MIN_TRANSFORMERS
from fastpath.shared.liger_families import READ_VERSION as LIGER_READ
from fastpath.shared.liger_families import SOURCE as LIGER_SOURCE
from fastpath.shared.liger_families import patch_function as liger_patch_function

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
CONV_DIST = "causal-conv1d"

# Dao-AILab/causal-conv1d release wheels: setup.py `get_wheel_url` names them; the matrix below is
# .github/workflows/_build.yml at v1.6.1.post4
# (https://github.com/Dao-AILab/causal-conv1d/blob/v1.6.1.post4/.github/workflows/_build.yml).
CAUSAL_CONV1D_RELEASE = "1.6.1.post4"
CAUSAL_CONV1D_WHEEL_TORCH = ("2.6", "2.7", "2.8", "2.9", "2.10")
CAUSAL_CONV1D_WHEEL_CUDA_MAJOR = (11, 12, 13)
CAUSAL_CONV1D_WHEEL_PYTHON = ("3.10", "3.11", "3.12", "3.13")


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # "error" blocks the fast path; "warning" may; "info" explains
    title: str
    detail: str
    remedies: tuple[str, ...]
    source: str

    @property
    def remedy(self) -> str:
        if len(self.remedies) == 1:
            return self.remedies[0]
        return "\n".join(f"{i}) {r}" for i, r in enumerate(self.remedies, 1))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["remedies"] = list(self.remedies)
        d["remedy"] = self.remedy
        return d


class Context(FactsView):
    """The facts view plus the model plan: what every rule's check reads."""

    def __init__(self, facts: dict[str, Any] | FactsView, plan: dict[str, Any] | None = None,
                 assumed: AssumedGpu | None = None) -> None:
        fv = view(facts, assumed)
        super().__init__(fv.raw, fv.assumed)
        self.plan = plan

    @property
    def facts(self) -> dict[str, Any]:
        return self.raw

    @property
    def model_uses_conv(self) -> bool:
        """True when the model (or, without --model, any hybrid model) needs causal_conv1d."""
        if self.plan is None:
            return True
        return any(r["dist"] == CONV_DIST for t in self.plan.get("layer_types", [])
                   for r in t["ops"])

    @property
    def conv_slow_layers(self) -> int:
        if self.plan is None:
            return 0
        return sum(t["count"] for t in self.plan.get("layer_types", [])
                   if any(r["dist"] == CONV_DIST and r["impl"] == FALLBACK for r in t["ops"]))

    @property
    def needs_cuda_torch_first(self) -> bool:
        """torch is missing or a CPU build: every route (compiler-free or not) starts with a CUDA
        build of torch; the compiler-free route is still the one to name first."""
        return not self.torch_cuda

    @property
    def fastpath_applies(self) -> bool:
        return self.model_uses_conv and (self.fastpath_route_available or self.needs_cuda_torch_first)

    def pkg(self, dist: str) -> dict[str, Any]:
        return self.package(dist)


# ------------------------------------------------------------------ remedy texts


# A CUDA build of torch, for remedies that start there (the driver decides which CUDA).
CUDA_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cu128"


def _torch_is(ctx: Context) -> str:
    return "this one has no CUDA" if ctx.torch_version else "none is installed"


def fastpath_install(ctx: Context) -> str:
    """What to install for `fastpath.enable()` on the target, from its facts: nothing when
    fastpath-kit and Triton are there (the doctor itself runs from fastpath-kit, so locally it
    always is); `[kernels]` brings torch, Triton and transformers (README)."""
    if ctx.package_version("fastpath-kit"):
        return "" if ctx.triton_version else "`pip install triton`, then "
    if ctx.torch_version and ctx.triton_version and ctx.package_version("transformers"):
        return "`pip install fastpath-kit`, then "
    return '`pip install "fastpath-kit[kernels]"`, then '


def _compiler_free(ctx: Context, what: str, also: str = "") -> str:
    first = (f"first a CUDA build of torch ({_torch_is(ctx)}: `{CUDA_TORCH_INSTALL}`, picking the "
             "CUDA your driver supports), then " if ctx.needs_cuda_torch_first else "")
    return (f"Compiler-free (no nvcc{also}): {first}{fastpath_install(ctx)}call `fastpath.enable()` "
            f"before loading the model, or run `fastpath run -- python train.py`; Triton compiles "
            f"the {what} kernels for {ctx.sm} at run time.")


def fastpath_route(ctx: Context) -> str:
    return _compiler_free(ctx, "causal_conv1d")


def toolkit_route(ctx: Context) -> str:
    if not ctx.torch_cuda:
        return (f"CUDA toolkit, for a source build of causal-conv1d: first a CUDA build of torch "
                f"({_torch_is(ctx)}); then install the toolkit of that torch's CUDA major.minor "
                "(for cu128, from NVIDIA's CUDA apt repository: `apt-get install cuda-nvcc-12-8 "
                "cuda-cudart-dev-12-8` and `apt-get install libcusparse-dev-12-8 "
                "libcublas-dev-12-8`), then `CUDA_HOME=/usr/local/cuda-12.8 pip install "
                "causal-conv1d --no-build-isolation`; the compiler's major must equal torch's.")
    cuda = ctx.torch_cuda
    mm = cuda.replace(".", "-")
    return (f"CUDA toolkit {cuda} (torch's CUDA): from NVIDIA's CUDA apt repository (cuda-keyring) "
            f"`apt-get install cuda-nvcc-{mm} cuda-cudart-dev-{mm}` and "
            f"`apt-get install libcusparse-dev-{mm} libcublas-dev-{mm}`, then `CUDA_HOME=/usr/local/cuda-{cuda} pip install causal-conv1d "
            f"--no-build-isolation`. The compiler's major must equal torch's ({ctx.torch_major}); "
            f"pip cannot provide nvcc {cuda}.")


def causal_conv1d_wheel(ctx: Context) -> dict[str, Any] | None:
    """The exact Dao-AILab prebuilt wheel name for this env and whether the release matrix has it."""
    tv = (ctx.torch.get("version") or "").split("+")[0]
    host = ctx.facts.get("host") or {}
    if not tv or not ctx.torch_major or not host.get("python"):
        return None
    torch_mm = ".".join(tv.split(".")[:2])
    py = host["python"].split(".")
    cp = f"cp{py[0]}{py[1]}"
    abi = "TRUE" if ctx.torch.get("cxx11_abi") else "FALSE"
    plat = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}.get(host.get("arch"), "linux_" + str(host.get("arch")))
    name = (f"causal_conv1d-{CAUSAL_CONV1D_RELEASE}+cu{ctx.torch_major}torch{torch_mm}"
            f"cxx11abi{abi}-{cp}-{cp}-{plat}.whl")
    missing = []
    if torch_mm not in CAUSAL_CONV1D_WHEEL_TORCH:
        missing.append(f"torch {torch_mm} (matrix: torch {CAUSAL_CONV1D_WHEEL_TORCH[0]}-"
                       f"{CAUSAL_CONV1D_WHEEL_TORCH[-1]})")
    if ctx.torch_major not in CAUSAL_CONV1D_WHEEL_CUDA_MAJOR:
        missing.append(f"cu{ctx.torch_major}")
    if f"{py[0]}.{py[1]}" not in CAUSAL_CONV1D_WHEEL_PYTHON:
        missing.append(f"Python {py[0]}.{py[1]}")
    if plat != "linux_x86_64":
        missing.append(plat)
    if abi == "FALSE" and torch_mm != "2.6":
        missing.append("cxx11abiFALSE")
    url = (f"https://github.com/Dao-AILab/causal-conv1d/releases/download/v{CAUSAL_CONV1D_RELEASE}/"
           + name.replace("+", "%2B"))
    return {"name": name, "url": url, "covered": not missing, "missing": missing}


def wheel_remedy(ctx: Context) -> str | None:
    w = causal_conv1d_wheel(ctx)
    if w and w["covered"]:
        return f"Prebuilt wheel (no nvcc): `pip install {w['url']}`"
    return None


# fla-core, not flash-linear-attention: fla-core 0.6.0 carries fla.ops, fla.modules and
# fla.backends, all that transformers and fastpath import, and needs only einops besides torch and
# Triton; flash-linear-attention adds FLA's own layers and models on top (fla/layers, fla/models).
# fastpath's tests run on fla-core (scripts/setup_fla.sh) and enable() names the same package.
FLA_REMEDY = (f"`{INSTALL['flash-linear-attention'][1]}` (pure Python + Triton, no compiler: the "
              "fla.ops kernels transformers imports; the flash-linear-attention package adds "
              "FLA's own layers and models on top of it and is not needed).")


# ------------------------------------------------------------------ checks (return template params)


def check_no_gpu(ctx: Context) -> dict | None:
    if ctx.gpu_present:
        return None
    err = ctx.probe_errors.get("gpus")
    return {"why": err or "nvidia-smi lists no GPU and torch sees no CUDA device"}


def check_torch_cpu_only(ctx: Context) -> dict | None:
    if ctx.facts.get("torch") and not ctx.torch_cuda:  # (blocks on any GPU: no GPU needed)
        return {"tv": ctx.torch.get("version")}
    return None


def check_torch_no_device(ctx: Context) -> dict | None:
    t = ctx.torch
    if ctx.device_assumed or not (ctx.gpus and ctx.torch_cuda and t.get("cuda_available") is False):
        return None
    drv = (ctx.facts.get("driver") or {}).get("cuda_version")
    why = t.get("cuda_error") or "torch.cuda.is_available() is False"
    env = ctx.env
    if "CUDA_VISIBLE_DEVICES" in env:
        why += f"; CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}"
    if drv:
        try:
            if Version(drv) < Version(str(ctx.torch_cuda)):
                why += f"; the driver supports CUDA {drv} < torch's CUDA {ctx.torch_cuda}"
        except InvalidVersion:
            pass
    return {"why": why, "tv": t.get("version")}


def check_torch_arch(ctx: Context) -> dict | None:
    if ctx.torch_arch_covered is False:
        return {"archs": " ".join(ctx.torch_arch_list), "sm": ctx.sm, "tv": ctx.torch_version}
    return None


def check_conv_missing(ctx: Context) -> dict | None:
    imp = ctx.pkg(CONV_DIST).get("import") or {}
    if not ctx.model_uses_conv or imp.get("ok") is not False:
        return None  # (no GPU needed: a missing package blocks the fast path on any GPU)
    if imp.get("error_kind") not in (None, "not-installed"):
        return None  # import failures with a cause have their own rules
    if ctx.plan is not None and not ctx.conv_slow_layers:
        return None  # the plan has causal_conv1d elsewhere (a Hub kernel): no torch fallback
    if ctx.plan is None and _hub_serves(ctx, "causal_conv1d_fn"):
        return None  # transformers >= 5.25 sends it to a Hub kernel (hub rules say which state)
    if ctx.plan is not None:
        what = (f"{ctx.conv_slow_layers} of {ctx.plan['layers_total']} layers of "
                f"{ctx.plan['model']} take the torch fallback for causal_conv1d_fn/_update")
    else:
        what = "hybrid models (Qwen3.5, Qwen3-Next, Mamba, LFM2...) take the torch fallback"
    return {"what": what}


def check_no_nvcc(ctx: Context) -> dict | None:
    """No nvcc, judged wherever a GPU is named (--gpu) or detected, or torch has CUDA: an image
    builder with a CPU torch and --gpu must hear the no-nvcc story too."""
    if ctx.nvccs or not (ctx.gpu_present or ctx.torch_cuda):
        return None
    opts = ctx.probe.get("options") or {}
    env = ctx.env
    places = ["PATH (which -a)", f"CUDA_HOME={env.get('CUDA_HOME', '(unset)')}",
              f"CUDA_PATH={env.get('CUDA_PATH', '(unset)')}", "/usr/local/cuda, /usr/local/cuda-*",
              "/opt/cuda*", "/usr/bin", f"$CONDA_PREFIX/bin ({env.get('CONDA_PREFIX', 'unset')})",
              "pip wheels nvidia/cu13/bin and nvidia/cuda_nvcc/bin in "
              + ", ".join(opts.get("nvcc_site_dirs") or opts.get("site_packages")
                          or ["site-packages"]),
              f"dpkg status {opts.get('dpkg_status', '/var/lib/dpkg/status')}", "rpm -qa"]
    return {"places": "; ".join(places)}


def check_nvcc_major(ctx: Context) -> dict | None:
    if not ctx.nvccs or ctx.matching_nvcc or ctx.torch_major is None:
        return None
    found = ", ".join(f"{c['path']} ({c['version']})" for c in ctx.nvccs)
    return {"found": found}


def check_ptxas_wheel(ctx: Context) -> dict | None:
    wheels = ctx.ptxas_only_wheels
    if not wheels or ctx.matching_nvcc:
        return None
    return {"path": wheels[0]["path"], "version": wheels[0].get("version") or "?"}


def check_cuda_home(ctx: Context) -> dict | None:
    home = ctx.cuda_home
    if not ctx.torch_cuda or not home:
        return None
    problems = []
    if home.get("torch_would_use") is None:
        if not ctx.nvccs:
            return None  # "no-usable-nvcc" says it all
        problems.append("torch's CUDA_HOME resolves to nothing although nvcc exists elsewhere")
    else:
        if not home.get("has_nvcc"):
            problems.append(f"{home['torch_would_use']}/bin/nvcc does not exist")
        missing = [h for h, ok in (home.get("headers") or {}).items() if not ok]
        if missing:
            problems.append(f"{home.get('include_dir')} lacks {', '.join(missing)}")
        v = home.get("nvcc_version")
        if v and ctx.torch_major and int(v.split(".")[0]) != ctx.torch_major:
            problems.append(f"its nvcc is {v}, torch is CUDA {ctx.torch_cuda}")
    if not problems:
        return None
    return {"home": home.get("torch_would_use"), "how": home.get("how"),
            "problems": "; ".join(problems)}


def check_gcc(ctx: Context) -> dict | None:
    gcc = (ctx.facts.get("gcc") or {}).get("version")
    if not ctx.model_uses_conv:
        return None
    bounds = host_gcc_unsupported(ctx.torch_cuda, gcc)
    if bounds is None:
        return None
    return {"gcc": gcc, "cuda": ctx.torch_cuda, "lo": bounds[0], "hi": bounds[1]}


def check_diverge(ctx: Context) -> dict | None:
    home = ctx.cuda_home
    if home.get("diverge"):
        return {"h": home.get("cuda_home_env"), "p": home.get("cuda_path_env")}
    return None


def _import_kind(ctx: Context, kind: str) -> dict | None:
    bad = [(d, p["import"]["error"]) for d, p in (ctx.facts.get("packages") or {}).items()
           if (p.get("import") or {}).get("error_kind") == kind]
    if not bad:
        return None
    return {"dists": ", ".join(d for d, _ in bad), "errors": " | ".join(f"{d}: {e}" for d, e in bad),
            "tv": ctx.torch.get("version"), "abi": ctx.torch.get("cxx11_abi"),
            "conv": any(d == CONV_DIST for d, _ in bad)}


def check_abi(ctx: Context) -> dict | None:
    return _import_kind(ctx, "abi-mismatch")


def check_cuda_init(ctx: Context) -> dict | None:
    return _import_kind(ctx, "cuda-init")


def check_import_other(ctx: Context) -> dict | None:
    r = _import_kind(ctx, "other")
    if r is None:
        return None
    installed = [d for d in r["dists"].split(", ") if ctx.pkg(d).get("version")]
    return r if installed else None


def _torch_devices(ctx: Context) -> list[str]:
    """Capabilities torch's SASS archs serve ("9.0" for sm_90): the devices an extension must
    serve when no device is known."""
    out = []
    for a in ctx.torch_arch_list:
        digits = a.removeprefix("sm_").rstrip("af")
        if a.startswith("sm_") and digits.isdigit() and len(digits) >= 2:
            out.append(f"{digits[:-1]}.{digits[-1]}")
    return out


def check_ext_arch(ctx: Context) -> dict | None:
    devices = [ctx.device_cc] if ctx.device_cc else _torch_devices(ctx)
    if not devices:
        return None
    bad = []
    for dist, p in (ctx.facts.get("packages") or {}).items():
        for so in p.get("so_files") or []:
            if not (so.get("sass") or so.get("ptx")):
                continue
            if not any(arch_runs_on(so.get("sass") or [], so.get("ptx") or [], cc)[0]
                       for cc in devices):
                bad.append((dist, so))
    if not bad:
        return None
    where = (f"device is compute capability {ctx.device_cc}" if ctx.device_cc else
             f"no GPU here, and it runs on none of the GPUs torch {ctx.torch_version} is built "
             f"for ({' '.join(ctx.torch_arch_list)})")
    return {"list": "; ".join(f"{d}: {so['path']} has {' '.join(so['sass'] + so['ptx'])}"
                              for d, so in bad),
            "dists": ", ".join(sorted({d for d, _ in bad})), "where": where,
            "cc": ctx.device_cc or ";".join(devices), "conv": any(d == CONV_DIST for d, _ in bad)}


def check_fla_hopper(ctx: Context) -> dict | None:
    tri = ctx.triton_version
    if not ctx.package_ok("flash-linear-attention"):
        return None
    if not fla_640(ctx.device_cc_tuple, tri, ctx.package_ok("tilelang")):
        return None
    fla = (ctx.package_version("flash-linear-attention")
           or ctx.package_version("fla-core"))
    return {"tv": tri, "fla": fla or "?"}


def fla_dqkwg_route(ctx: Context) -> str | None:
    """fastpath's own answer to FLA #640: only the refused op changes implementation."""
    if not ctx.fastpath_route_available:
        return None
    return ("Without new packages: `fastpath.enable()` (or `fastpath run -- python train.py`) keeps "
            "FLA's kernels and routes only the refused op (chunk_bwd_dqkwg) to fastpath's PyTorch "
            "implementation: the backward runs and is correct; that op is about 3.5x slower than "
            "FLA's kernel (H200, BENCHMARKS.md).")


def check_dao_sm103(ctx: Context) -> dict | None:
    sos = ctx.pkg(CONV_DIST).get("so_files") or []
    sass = [a for so in sos for a in so.get("sass") or []]
    why = dao_sm103_nvcc13(ctx.device_cc_tuple, sass, bool(ctx.pkg(CONV_DIST).get("version")),
                           [c["major"] for c in ctx.nvccs])
    if why is None:
        return None
    path = next((so["path"] for so in sos if any(a.startswith("sm_103") for a in so.get("sass") or [])),
                None)
    return {"path": path or why}


def check_silent_fallback(ctx: Context) -> dict | None:
    v = ctx.version("transformers")
    if v is None or not (Version("5.15") <= v < Version("5.17")):
        return None
    if ctx.plan is not None and not ctx.plan.get("layers_slow"):
        return None
    return {"v": str(v)}


def _hub_serves(ctx: Context, op_name: str) -> HubStatus | None:
    """The Hub kernel transformers (>= 5.25, `kernels` installed, Hub kernels on) loads for
    `op_name` here, None when it does not (or when, offline, its cached version has no build here
    and transformers keeps its own path)."""
    from fastpath.doctor.families import Op

    tv = ctx.version("transformers")
    op = Op(op_name, "", "")
    if tv is None or not hub_kernel_525(op, tv, ctx, ctx.hub_kernels_enabled):
        return None
    st = hub_status(ctx, *HUB_MAPPED_525[op_name])
    return None if st.state == OFFLINE_NO_BUILD else st


def hub_statuses(ctx: Context) -> list[HubStatus]:
    """The Hub repos transformers would load here: the model plan's (as loaded), or without
    --model both that hybrid models use (kernels-community/fla and kernels-community/mamba-ssm)."""
    if ctx.plan is not None:
        names = [r["op"] for t in ctx.plan.get("layer_types") or [] for r in t["ops"]
                 if r.get("impl") == "hub-kernel" and r.get("hub") and r["op"] in HUB_MAPPED_525]
    else:
        names = ["chunk_gated_delta_rule", "causal_conv1d_fn"]
    seen: dict[str, HubStatus] = {}
    for name in names:
        st = _hub_serves(ctx, name)
        if st is not None:
            seen.setdefault(st.repo, st)
    return list(seen.values())


def check_hub_default(ctx: Context) -> dict | None:
    missing = [st for st in hub_statuses(ctx) if st.state != CACHED]
    if not missing:
        return None
    offline = any(st.state == OFFLINE_MISSING for st in missing)
    where = ctx.hub_cache.get("cache_dir") or "the Hub cache (not probed)"
    return {"v": str(ctx.version("transformers")), "cache": where,
            "states": "; ".join(f"{st.label} [{st.detail}]" for st in missing),
            "then": ("HF_HUB_OFFLINE is set: from_pretrained onto a GPU raises ValueError (kernels "
                     "finds no cached version and kernelize does not catch it)" if offline else
                     "from_pretrained onto a GPU downloads them (an air-gapped host without "
                     "HF_HUB_OFFLINE=1 stalls on the network, with it raises ValueError)"),
            "repos": missing}


def hub_predownload(ctx: Context) -> str | None:
    """Pre-download the missing builds, online, with this very torch/CUDA (kernels picks the build
    for the environment it runs in and records the version ref, which offline loading needs)."""
    params = check_hub_default(ctx)
    if params is None:
        return None
    calls = "; ".join(f"kernels.get_kernel('{st.repo}', version={st.version})"
                      for st in params["repos"] if st.version is not None)
    if not calls:
        return None
    return (f"Or pre-download them while online, in this environment: `python -c \"import kernels; "
            f"{calls}\"`; then HF_HUB_OFFLINE=1 loads them from {params['cache']}.")


def hub_fastpath_route(ctx: Context) -> str:
    fla = any(st.repo == FLA_REPO for st in (check_hub_default(ctx) or {}).get("repos", []))
    needs = (" The FLA ops (gated delta rule, KDA) then come from the fla package: "
             f"{'fla-core is installed' if ctx.package_ok('flash-linear-attention') else '`pip install fla-core`'}."
             if fla else "")
    return ("`fastpath.enable()` before from_pretrained (or `fastpath run -- python train.py`) "
            "routes around Hub kernels: it sets USE_HUB_KERNELS=0 unless you set it, and routes "
            "causal_conv1d and the Mamba ops to fastpath's Triton kernels." + needs)


def check_hub_cached(ctx: Context) -> dict | None:
    cached = [st for st in hub_statuses(ctx) if st.state == CACHED]
    if not cached:
        return None
    return {"v": str(ctx.version("transformers")),
            "states": "; ".join(f"{st.label} ({st.detail})" for st in cached)}


def check_mamba_kernels_hub_only(ctx: Context) -> dict | None:
    v = ctx.version("transformers")
    if v is None or not (Version("5.0") <= v < Version("5.15")) or ctx.plan is None:
        return None
    if not ctx.plan.get("all_or_nothing") or not ctx.package_ok("kernels"):
        return None
    return {"v": str(v)}


def check_speculators_norm(ctx: Context) -> dict | None:
    model_type = (ctx.plan or {}).get("model_type") or None
    which = speculators_zero_centred_norm(ctx.package_version("speculators"), model_type)
    if which is None:
        return None
    target = f"this {model_type} target" if model_type else f"targets of type {', '.join(ZERO_CENTRED_FINAL_NORM)}"
    return {"v": ctx.package_version("speculators"), "which": which, "target": target}


def check_liger_composes(ctx: Context) -> dict | None:
    """A --model whose family Liger Kernel patches: say that it composes with enable(), and
    whether liger-kernel is here (whether it is *applied* only the process knows: explain())."""
    model_type = str((ctx.plan or {}).get("model_type") or "")
    fn = liger_patch_function(model_type)
    if fn is None:
        return None
    v = ctx.package_version("liger-kernel")
    tv = ctx.version("transformers")
    if v is None:
        here = "liger-kernel is not installed here"
    elif tv is not None and tv < Version(LIGER_MIN_TRANSFORMERS):
        here = (f"liger-kernel {v} is installed, but {LIGER_READ} refuses transformers {tv} at import "
                f"(needs >= {LIGER_MIN_TRANSFORMERS})")
    else:
        here = f"liger-kernel {v} is installed"
    return {"model_type": model_type, "fn": fn, "here": here, "effect": LIGER_EFFECT,
            "install": "" if v is not None else 'pip install "fastpath-kit[train]"; then '}


def mamba_ops_routed(ctx: Context) -> bool:
    """fastpath.enable() routes every kernel op of this model's Mamba layers (the Mamba-2 and
    Mamba-1 families, per families.Op.fastpath), so mamba_ssm is not needed for the fast path."""
    from fastpath.doctor.families import family_for

    fam = family_for(str((ctx.plan or {}).get("model_type") or ""))
    return fam is not None and all(op.fastpath for ops in fam.ops_by_layer.values() for op in ops)


def check_mamba_needs_ssm(ctx: Context) -> dict | None:
    if ctx.plan is None or not ctx.plan.get("all_or_nothing"):
        return None
    if ctx.package_ok("mamba-ssm"):
        return None
    routed = mamba_ops_routed(ctx)
    return {"n": ctx.plan.get("layers_slow") or ctx.plan.get("layers_total"),
            "total": ctx.plan.get("layers_total"), "model": ctx.plan.get("model"),
            "enable": " fastpath.enable() routes all of this family's ops (Mamba scans, state "
                      "update, causal_conv1d) to fastpath's Triton kernels instead." if routed else
                      " fastpath does not route this family's selective scan."}


def mamba_fastpath_route(ctx: Context) -> str | None:
    """The compiler-free route for the Mamba families (None where it does not apply)."""
    if not (mamba_ops_routed(ctx) and (ctx.fastpath_route_available or ctx.needs_cuda_torch_first)):
        return None
    return _compiler_free(ctx, "Mamba and causal_conv1d", ", no mamba_ssm")


def check_fla_missing(ctx: Context) -> dict | None:
    if ctx.plan is None:
        return None
    slow = [(t["count"], r["op"], r["impl"] == FALLBACK) for t in ctx.plan.get("layer_types", [])
            for r in t["ops"]
            if r["dist"] == "flash-linear-attention" and FALLBACK in (r["impl"], r["with_fastpath"])
            and not ctx.package_ok("flash-linear-attention")]
    if not slow:
        return None
    when = "" if any(now for *_, now in slow) else (
        " after fastpath.enable() (it turns transformers' Hub kernels off; as loaded they come "
        "from kernels-community/fla)")
    return {"n": slow[0][0], "total": ctx.plan["layers_total"],
            "ops": ", ".join(sorted({op for _, op, _ in slow})), "when": when}


def check_mamba_scan_missing(ctx: Context) -> dict | None:
    ext = ctx.extension_module("mamba-ssm", "selective_scan_cuda")
    if not mamba1_cuda_scan_missing(ctx.package_ok("mamba-ssm"), ext):
        return None
    if ctx.plan is not None and not any(r["op"] in MAMBA1_CUDA_SCAN_OPS
                                        for t in ctx.plan.get("layer_types") or [] for r in t["ops"]):
        return None  # this model does not call the Mamba-1 scan
    where = (f"{ctx.plan['layers_total']} layers of {ctx.plan['model']} call" if ctx.plan
             else "Mamba-1 models (mamba, falcon_mamba, jamba, zamba) call")
    return {"v": ctx.package_version("mamba-ssm") or "?", "where": where}


def mamba1_fastpath_route(ctx: Context) -> str | None:
    if not (ctx.fastpath_route_available or ctx.needs_cuda_torch_first):
        return None
    return _compiler_free(ctx, "Mamba-1 selective scan, state update and causal_conv1d",
                          ", no mamba_ssm CUDA build")


def check_conv_wheel(ctx: Context) -> dict | None:
    imp = ctx.pkg(CONV_DIST).get("import") or {}
    if imp.get("ok") is not False or not ctx.model_uses_conv:
        return None
    w = causal_conv1d_wheel(ctx)
    if w is None:
        return None
    status = "covered by the release matrix" if w["covered"] else (
        "NOT covered by the release matrix (torch 2.6-2.10, cu11/12/13, CPython 3.10-3.13, "
        "x86_64): missing " + ", ".join(w["missing"]))
    return {"name": w["name"], "status": status, "url": w["url"]}


def check_triton_no_backend(ctx: Context) -> dict | None:
    if ctx.gpu_present and ctx.triton_version and ctx.triton_gpu_backend is False:
        return {"v": ctx.triton_version}
    return None


# ------------------------------------------------------------------ the rules table


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    title: str
    check: Callable[[Context], dict | None]
    detail: str  # str.format template over the check's params
    remedies: tuple[str | Callable[[Context], str | None], ...]
    source: str
    fastpath_first: bool = False  # prepend the compiler-free route when it applies


def _conv_fastpath(ctx: Context, params: dict) -> bool:
    return bool(params.get("conv", True))


RULES: tuple[Rule, ...] = (
    Rule("no-gpu", "info", "No GPU visible: the verdict needs the GPU host", check_no_gpu,
         "{why}. Kernel paths are decided on the GPU host; this report shows the toolchain only.",
         ("Judge these packages for the GPU you will run on: `fastpath doctor --gpu sm_120` "
          "(a capability, or a name such as `--gpu H100`).",
          "Or run the doctor where the GPU is: `fastpath doctor --on 'ssh HOST'` (in a "
          "container: `--on 'docker exec -i CONTAINER'`).",),
         "https://pytorch.org/docs/stable/notes/cuda.html"),
    Rule("torch-cpu-build", "error", "torch is a CPU-only build: no GPU can be used",
         check_torch_cpu_only,
         "torch {tv} has no CUDA (torch.version.cuda is None): every kernel runs on the CPU, "
         "whatever GPU the host has.",
         ("Install a CUDA build of torch: `pip install torch --index-url "
          "https://download.pytorch.org/whl/cu128` (pick the CUDA your driver supports).",),
         "https://pytorch.org/get-started/locally/"),
    Rule("torch-no-cuda-device", "error", "torch cannot use the GPU that nvidia-smi lists",
         check_torch_no_device,
         "torch {tv}: {why}. Every kernel path then runs on CPU or fails.",
         ("Update the driver to one that supports torch's CUDA, or install the torch build for "
          "the driver's CUDA; check CUDA_VISIBLE_DEVICES and the container's GPU access.",),
         "https://docs.nvidia.com/deploy/cuda-compatibility/"),
    Rule("torch-arch-not-covered", "error", "torch was not built for this GPU", check_torch_arch,
         "torch {tv} arch list [{archs}] has no kernel that runs on {sm}.",
         ("Install a torch build whose arch list covers the GPU (cu128+ wheels include sm_120).",),
         "https://github.com/pytorch/pytorch/blob/main/torch/cuda/__init__.py"),
    Rule("causal-conv1d-missing", "error", "causal-conv1d is not installed: torch fallback",
         check_conv_missing,
         "{what}. transformers falls back per function to F.conv1d + SiLU: 13-16x slower "
         "forward than Dao's kernel on an H200 at D=10240 (BENCHMARKS.md, causal_conv1d kernels).",
         (wheel_remedy, toolkit_route),
         "https://github.com/Dao-AILab/causal-conv1d/issues/103", fastpath_first=True),
    Rule("fla-missing", "error", "FLA (`import fla`) is not importable: torch GatedDeltaNet",
         check_fla_missing,
         "{n} of {total} layers run {ops} in PyTorch{when}.",
         (FLA_REMEDY,),
         "https://github.com/fla-org/flash-linear-attention#installation"),
    Rule("mamba-needs-mamba-ssm", "error", "Mamba fast path also needs mamba_ssm",
         check_mamba_needs_ssm,
         "The Mamba-family fast path in transformers is all-or-nothing: without mamba_ssm all "
         "{n} of {total} layers of {model} stay on the torch path, whatever causal_conv1d is "
         "installed.{enable}",
         (mamba_fastpath_route, "`pip install mamba-ssm --no-build-isolation` (compiled: needs a prebuilt wheel for this "
          "torch or nvcc matching torch's CUDA), together with a causal_conv1d.",),
         "https://github.com/huggingface/transformers/blob/v5.14.0/src/transformers/models/mamba2/modeling_mamba2.py"),
    Rule("no-usable-nvcc", "warning", "No nvcc anywhere: causal-conv1d cannot build from source",
         check_no_nvcc,
         "Checked: {places}. causal-conv1d's setup.py then dies with `NameError: name "
         "'bare_metal_version' is not defined` before it would try a prebuilt wheel.",
         (toolkit_route,),
         "https://github.com/Yuanshi9815/Video-Infinity/issues/12", fastpath_first=True),
    Rule("nvcc-major-mismatch", "warning", "nvcc's CUDA major differs from torch's", check_nvcc_major,
         "Found {found}; torch's cpp_extension refuses to build when the nvcc major differs from "
         "torch.version.cuda.",
         (toolkit_route,),
         "https://github.com/pytorch/pytorch/blob/main/torch/utils/cpp_extension.py",
         fastpath_first=True),
    Rule("cu12-nvcc-wheel-ptxas-only", "warning", "The CUDA 12 pip nvcc wheel has no nvcc",
         check_ptxas_wheel,
         "{path} (nvidia-cuda-nvcc-cu12 {version}) ships only ptxas; it cannot compile "
         "causal-conv1d.",
         ("Uninstall it if it was installed for nvcc (`pip uninstall nvidia-cuda-nvcc-cu12`) and "
          "use a real toolkit.", toolkit_route),
         "https://github.com/NVIDIA/cuda-python/issues/2100", fastpath_first=True),
    Rule("cuda-home-stale", "warning", "torch's CUDA_HOME is not a usable toolkit", check_cuda_home,
         "torch.utils.cpp_extension would use CUDA_HOME={home} ({how}): {problems}. Builds need "
         "bin/nvcc plus cuda_runtime.h and cusparse.h (ATen includes cusparse.h).",
         ("Point CUDA_HOME at a full toolkit matching torch (e.g. `export "
          "CUDA_HOME=/usr/local/cuda-X.Y`) or unset a stale CUDA_HOME/CUDA_PATH.", toolkit_route),
         "https://github.com/facebookresearch/maskrcnn-benchmark/issues/685", fastpath_first=True),
    Rule("host-gcc-unsupported", "warning", "Host gcc is outside CUDA's supported range",
         check_gcc,
         "gcc {gcc}: nvcc {cuda} accepts host gcc {lo}-{hi}; a source build of causal-conv1d "
         "fails in the host compiler step.",
         ("Install a supported gcc (e.g. `apt-get install gcc-13 g++-13`) and build with "
          "`CC=gcc-13 CXX=g++-13 NVCC_CCBIN=gcc-13`.",),
         "https://github.com/pytorch/pytorch/blob/main/torch/utils/cpp_extension.py",
         fastpath_first=True),
    Rule("cuda-home-path-diverge", "warning", "CUDA_HOME and CUDA_PATH point to different places",
         check_diverge,
         "CUDA_HOME={h} but CUDA_PATH={p}: torch uses CUDA_HOME first, cuda-pathfinder (CuPy, "
         "cuda-python) prefers CUDA_PATH, so tools disagree about the toolkit.",
         ("Set both to the same toolkit, or unset the stale one.",),
         "https://github.com/NVIDIA/cuda-python/blob/main/cuda_pathfinder/docs/source/release/1.5.0-notes.rst"),
    Rule("extension-missing-arch", "error", "A compiled extension has no code for this GPU",
         check_ext_arch,
         "{list}; {where}. At run time: 'no kernel image is available "
         "for execution on the device'.",
         ("Rebuild for this GPU: `TORCH_CUDA_ARCH_LIST=\"{cc}+PTX\" pip install --no-build-isolation "
          "--force-reinstall --no-binary :all: {dists}`.",),
         "https://github.com/Dao-AILab/causal-conv1d/issues/119", fastpath_first=True),
    Rule("extension-abi-mismatch", "error", "Extension import fails: undefined symbol (ABI mismatch)",
         check_abi,
         "{errors}. The extension was built against another torch (version or C++11 ABI; this "
         "torch is {tv}, cxx11_abi={abi}).",
         ("Reinstall it built for this torch: `pip install --no-build-isolation --force-reinstall "
          "--no-cache-dir {dists}` (or the release wheel whose name matches torch X.Y and "
          "cxx11abi).",),
         "https://github.com/Dao-AILab/causal-conv1d/issues/35", fastpath_first=True),
    Rule("extension-cuda-init", "error", "Extension import fails while initialising CUDA",
         check_cuda_init, "{errors}.",
         ("Check the driver supports torch's CUDA (`nvidia-smi` CUDA Version >= torch.version.cuda) "
          "and that the container sees the GPU (`--gpus all`).",),
         "https://docs.nvidia.com/deploy/cuda-compatibility/"),
    Rule("extension-import-error", "warning", "Extension import fails", check_import_other,
         "{errors}.", ("Reinstall the package: `pip install --force-reinstall {dists}`.",),
         "https://docs.python.org/3/library/importlib.html"),
    Rule("fla-hopper-backward", "error", "FLA refuses the gated-delta backward on Hopper with this Triton",
         check_fla_hopper,
         "fla {fla} with Triton {tv} on compute capability 9.x: the chunk backward gives wrong "
         "results for Triton >=3.4,<3.7.1, so FLA raises in training (forward is fine).",
         (fla_dqkwg_route,
          "`pip install -U \"triton>=3.7.1\"` (check torch compatibility), or `pip install "
          "tilelang` so FLA uses its TileLang backward."),
         "https://github.com/fla-org/flash-linear-attention/issues/640"),
    Rule("dao-sm103-nvcc13", "error", "Dao causal-conv1d built by nvcc 13 for sm_103 is wrong",
         check_dao_sm103,
         "{path}: causal-conv1d's sm_103 cubin from nvcc 13 gives wrong forward/update output "
         "(error 0.4-0.6) on B300.",
         ("Rebuild causal-conv1d without the sm_103 gencode (upstream PR #106), keeping sm_100 "
          "SASS + PTX.",),
         "https://github.com/Dao-AILab/causal-conv1d/issues/105", fastpath_first=True),
    Rule("transformers-silent-fallback", "warning", "transformers 5.15/5.16 fall back silently",
         check_silent_fallback,
         "transformers {v} routes to the torch implementation without any warning when a kernel "
         "package is missing (5.17 added the warning).",
         ("Check the model: `fastpath doctor --model ...` or `fastpath.assert_fast(model)`; or "
          "upgrade to transformers >= 5.17 to see the warning.",),
         "https://github.com/huggingface/transformers/blob/v5.15.0/src/transformers/integrations/hub_kernels.py"),
    Rule("transformers-hub-kernels-default", "error",
         "transformers >= 5.25 loads Hub kernels that are not in the local cache",
         check_hub_default,
         "transformers {v} with `kernels` installed defaults from_pretrained(use_kernels=True) and "
         "sends these ops to Hub kernels: {states}. Then: {then}. Without Hub kernels "
         "(USE_HUB_KERNELS=0) transformers uses the installed package, else its torch fallback, "
         "where packed inputs (cu_seqlens / seq_idx) raise ValueError.",
         (hub_fastpath_route, hub_predownload,
          "`export USE_HUB_KERNELS=0` (transformers then imports the installed packages; "
          "`HF_HUB_OFFLINE=1` too on a host without network)."),
         TRANSFORMERS_HUB_SOURCE),
    Rule("hub-kernel-cached", "info", "Hub kernels load from the local cache",
         check_hub_cached,
         "transformers {v}: {states}; HF_HUB_OFFLINE=1 loads them without the network.",
         ("Nothing to install. fastpath.enable() turns Hub kernels off unless USE_HUB_KERNELS is "
          "set: `export USE_HUB_KERNELS=1` before it keeps these cached ones.",),
         "https://github.com/huggingface/kernels/blob/main/src/kernels/_internals/resolver.py"),
    Rule("mamba-ssm-cuda-scan-missing", "error",
         "mamba_ssm imports without its Mamba-1 CUDA scan: selective_scan_fn raises when called",
         check_mamba_scan_missing,
         "mamba_ssm {v} has no selective_scan_cuda extension (since state-spaces/mamba#977 it is "
         "built only with MAMBA_KEEP_CUDA_BUILD=TRUE) but still imports, so transformers picks "
         "its selective_scan_fn / mamba_inner_fn: {where} them, and they raise when called.",
         (mamba1_fastpath_route,
          "Or reinstall mamba_ssm with its CUDA scan: `MAMBA_KEEP_CUDA_BUILD=TRUE pip install "
          "--no-build-isolation --force-reinstall --no-cache-dir mamba-ssm` (needs nvcc matching "
          "torch's CUDA)."),
         MAMBA_PR_977),
    Rule("mamba-kernels-hub-only", "warning",
         "Mamba layers load causal-conv1d from the hub only", check_mamba_kernels_hub_only,
         "transformers {v}: with `kernels` installed, lazy_load_kernel('causal-conv1d') never "
         "tries the local package and crashes model construction offline.",
         ("`export USE_HUB_KERNELS=0` (honoured from 5.14), or `pip uninstall kernels`, or "
          "upgrade transformers to >= 5.15.",),
         "https://github.com/huggingface/transformers/blob/v5.14.0/src/transformers/integrations/hub_kernels.py"),
    Rule("speculators-zero-centred-verifier-norm", "warning",
         "speculators trains drafters against wrong verifier logits for zero-centred final norms",
         check_speculators_norm,
         "speculators {v}: {which} rebuild(s) the verifier's logits for {target} through an x̂·w norm loaded "
         "with the raw model.norm.weight, while the target computes x̂·(1 + w) (measured on real targets "
         "upstream: logits rel-L2 0.51, KL ~0.48 nat).",
         ("`fastpath capture MODEL --out hs/ --check-client speculators --client-target DIR` measures it and "
          "writes DIR (model.norm.weight stored as 1 + w); pass DIR as speculators' --verifier-name-or-path "
          "for the drafters it reports as fixed.",),
         " ".join(SPECULATORS_NORM_SOURCES)),
    Rule("liger-kernel-composes", "info", "Liger Kernel composes with fastpath.enable() for this model",
         check_liger_composes,
         "{model_type}: Liger Kernel's `{fn}` (RMSNorm, SwiGLU MLP, fused linear cross-entropy) and "
         "fastpath.enable() route different ops and work together in either order; {here}. "
         "Measured for training (H200, 8-layer Qwen3.5-27B shape, bf16, B=1, L=4096): {effect}.",
         ("{install}after building the model: `fastpath.enable()`, then `{fn}(model=model)` (or Liger's "
          "class-level call before both); `fastpath.explain(model)` lists Liger's ops beside fastpath's, "
          "`fastpath verify MODEL --liger` checks the composed model.",),
         LIGER_SOURCE),
    Rule("causal-conv1d-prebuilt-wheel", "info", "causal-conv1d prebuilt wheel for this environment",
         check_conv_wheel,
         "{name}: {status}.",
         (lambda ctx: "`pip install {url}`" if (causal_conv1d_wheel(ctx) or {}).get("covered")
          else "No release wheel for this combination: use the compiler-free or toolkit route.",),
         "https://github.com/Dao-AILab/causal-conv1d/releases"),
    Rule("triton-no-gpu-backend", "warning", "Triton has no GPU backend here",
         check_triton_no_backend,
         "Triton {v} is installed but its driver finds no GPU: Triton kernels (FLA, fastpath) "
         "cannot run.",
         ("Install the Triton matching torch (`pip install triton` for the torch version's pin) "
          "and check libcuda is visible (container `--gpus all`).",),
         "https://github.com/triton-lang/triton#compatibility"),
)


def _render(item: str | Callable[[Context], str | None], ctx: Context, params: dict) -> str | None:
    text = item(ctx) if callable(item) else item
    if text is None:
        return None
    try:
        return text.format(**params)
    except (KeyError, IndexError, ValueError):
        return text


def evaluate(facts: dict[str, Any] | Context, plan: dict[str, Any] | None = None) -> list[Finding]:
    """All findings for these facts (and plan), most severe first, rule order within a severity.
    A Context (facts view + plan, perhaps an assumed GPU) may be passed instead of the two."""
    ctx = facts if isinstance(facts, Context) else Context(facts, plan)
    findings = []
    for rule in RULES:
        params = rule.check(ctx)
        if params is None:
            continue
        remedies = [_render(r, ctx, params) for r in rule.remedies]
        items = [r for r in remedies if r]
        if rule.fastpath_first and ctx.fastpath_applies and _conv_fastpath(ctx, params):
            items.insert(0, fastpath_route(ctx))
        findings.append(Finding(rule.id, rule.severity, rule.title, _render(rule.detail, ctx, params)
                                or "", tuple(items), rule.source))
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
