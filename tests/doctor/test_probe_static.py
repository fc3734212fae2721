"""The import-free probe (`doctor --probe static`, the fleet default): the ELF link check that
stands in for `import`, checked against the real dynamic loader on libraries gcc builds here, and
the static facts on fake site-packages trees."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakeenv import build_elf, fatbin_container, write_dist_info

from fastpath.doctor import probe
from fastpath.doctor.diagnosis import diagnose

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")

# C can define C++-mangled names directly: c10::f(), at::g(), c10::missing()
C10_F, AT_G, C10_MISSING = "_ZN3c101fEv", "_ZN2at1gEv", "_ZN3c107missingEv"


def _cc(out: Path, source: str, *extra: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(out), str(src), *extra], check=True)
    return out


def _libs(tmp: Path) -> tuple[Path, Path, Path]:
    """A fake libc10.so exporting c10::f and at::g; one extension that needs only those and one
    that also needs c10::missing (built against a 'different torch')."""
    lib = _cc(tmp / "libc10.so", f"int {C10_F}(void) {{ return 1; }}\nvoid {AT_G}(void) {{}}\n")
    good = _cc(tmp / "good_ext.so", f"int {C10_F}(void);\nvoid {AT_G}(void);\n"
               f"int use(void) {{ {AT_G}(); return {C10_F}(); }}\n")
    bad = _cc(tmp / "bad_ext.so", f"int {C10_F}(void);\nint {C10_MISSING}(void);\n"
              f"int use(void) {{ return {C10_F}() + {C10_MISSING}(); }}\n")
    return lib, good, bad


@needs_gcc
def test_link_check_agrees_with_the_dynamic_loader(tmp_path):
    lib, good, bad = _libs(tmp_path)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)  # what `import torch` does for its libs
    ctypes.CDLL(str(good))
    with pytest.raises(OSError, match=f"undefined symbol: {C10_MISSING}"):
        ctypes.CDLL(str(bad))
    ok = probe.link_check(str(good), [str(lib)])
    assert ok["checked"] == 2 and ok["missing"] == [] and ok["missing_count"] == 0
    broken = probe.link_check(str(bad), [str(lib)])
    assert broken["missing"] == [C10_MISSING] and broken["missing_count"] == 1


def test_torch_symbol_names():
    for name in (C10_F, AT_G, "_ZNK2at10TensorBase4sizeEl", "_ZTVN3c1011StorageImplE",
                 "_ZN5torch8autograd4NodeD2Ev", "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"):
        assert probe.torch_symbol(name), name
    for name in ("PyInit_x", "_ZNSt6thread6_StateD2Ev", "_ZN4cuda2at1fEv", "memcpy", "_Z"):
        assert not probe.torch_symbol(name), name


def test_gnu_hash_lookup_matches_the_full_table_on_real_torch():
    torch = pytest.importorskip("torch")
    libdir = Path(torch.__file__).parent / "lib"
    dyn = probe.ElfDynamic(str(libdir / "libc10.so"))
    assert dyn.gnu_hash is not None
    names = [probe._cstr(dyn.dynstr, n)
             for n, bind, shndx in (dyn.symbol(i) for i in range(1, len(dyn.dynsym) // dyn.entsize))
             if shndx != 0 and bind in (1, 2)]
    assert len(names) > 500
    assert all(dyn.defines(n) for n in names)
    assert not any(dyn.defines(n + "_not") for n in names[:300])
    # torch's own python bindings need thousands of torch symbols, all exported by torch/lib
    libs = sorted(glob.glob(str(libdir / "lib*.so*")))
    r = probe.link_check(str(libdir / "libtorch_python.so"), libs)
    assert r["checked"] > 1000 and r["missing_count"] == 0


def _site(tmp: Path, lib: Path, ext: Path, cuda: str | None) -> Path:
    site = tmp / "site"
    version_py = f"__version__ = '2.9.0'\ncuda: str | None = {cuda!r}\nhip = None\n".encode()
    write_dist_info(site, "torch", "2.9.0", {"torch/__init__.py": b"", "torch/version.py": version_py,
                                             "torch/lib/libc10.so": lib.read_bytes()})
    write_dist_info(site, "causal-conv1d", "1.5.0", {
        "causal_conv1d/__init__.py": b"",
        "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": ext.read_bytes()})
    write_dist_info(site, "transformers", "4.57.6", {"transformers/__init__.py": b""})
    return site


def _static_facts(site: Path) -> dict:
    return probe.collect(site_packages=[str(site)], skip=["imports", "nvidia-smi", "rpm"],
                         dpkg_status=str(site / "no-dpkg"))


@needs_gcc
def test_static_probe_reports_abi_mismatch_from_files(tmp_path):
    lib, _, bad = _libs(tmp_path)
    facts = _static_facts(_site(tmp_path, lib, bad, "12.8"))
    conv = facts["packages"]["causal-conv1d"]
    assert conv["version"] == "1.5.0"
    imp = conv["import"]
    assert imp["ok"] is False and imp["error_kind"] == "abi-mismatch"
    assert imp["error"].startswith(f"undefined symbol: {C10_MISSING}")
    assert imp["how"].startswith("static")
    t = facts["torch"]
    assert t["version"] == "2.9.0" and t["cuda"] == "12.8" and t["source"].startswith("static")
    assert t["cuda_available"] is False  # no GPU listed
    assert facts["packages"]["transformers"]["import"]["ok"] is True
    # the rules turn it into the same finding an import failure gives
    diagnosis = diagnose(facts, "qwen3.5-27b")
    assert any("abi" in f.id for f in diagnosis.findings), [f.id for f in diagnosis.findings]


@needs_gcc
def test_static_probe_passes_a_matching_build_and_reads_a_cpu_torch(tmp_path):
    lib, good, _ = _libs(tmp_path)
    facts = _static_facts(_site(tmp_path, lib, good, None))
    imp = facts["packages"]["causal-conv1d"]["import"]
    assert imp["ok"] is True and imp["link_check"] == {"so_files": 1, "torch_symbols": 2}
    assert facts["torch"]["cuda"] is None and facts["torch"]["cuda_available"] is False
    assert facts["packages"]["mamba-ssm"]["import"]["error_kind"] == "not-installed"


def test_static_probe_without_torch_says_so(tmp_path):
    site = tmp_path / "site"
    write_dist_info(site, "causal-conv1d", "1.5.0", {"causal_conv1d/__init__.py": b""})
    facts = _static_facts(site)
    assert facts["torch"] is None
    imp = facts["packages"]["causal-conv1d"]["import"]
    assert imp["ok"] is False and "needs torch" in imp["error"]


def test_dist_info_without_module_is_not_installed(tmp_path):
    site = tmp_path / "site"
    write_dist_info(site, "transformers", "5.0.0", {})
    imp = _static_facts(site)["packages"]["transformers"]["import"]
    assert imp["ok"] is False and imp["error_kind"] == "not-installed"


def test_static_flag_runs_the_probe_file_with_no_import_subprocess():
    src = Path(probe.__file__).read_bytes()
    env = dict(os.environ, FASTPATH_PROBE_SKIP="nvidia-smi")
    out = subprocess.run([sys.executable, "-", "--static"], input=src, capture_output=True,
                         env=env, timeout=60, check=True)
    facts = json.loads(out.stdout)
    assert facts["probe"]["options"]["skip"] == ["imports", "nvidia-smi"]
    if facts["packages"]["torch"]["version"]:
        assert facts["torch"]["source"].startswith("static")


def test_cli_probe_static_json(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fastpath", "doctor", "--probe", "static", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert "imports" in report["facts"]["probe"]["options"]["skip"]


@needs_gcc
def test_static_probe_reports_a_corrupt_extension(tmp_path):
    lib, good, _ = _libs(tmp_path)
    corrupt = tmp_path / "corrupt.so"
    corrupt.write_bytes(good.read_bytes()[:200])  # an ELF header, cut short
    imp = _static_facts(_site(tmp_path, lib, corrupt, "12.8"))["packages"]["causal-conv1d"]["import"]
    assert imp["ok"] is False and imp["error_kind"] == "other"
    assert imp["error"].startswith("cannot load causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so: ")
    assert "\n" not in imp["error"]


def _cuda_torch(tmp: Path, rodata: bytes) -> dict:
    """A CUDA torch tree: libtorch_python.so with `rodata`, libtorch_cuda.so with a fatbin of
    sm_80 + sm_90a SASS and compute_90 PTX (files built with struct, not gcc)."""
    site = tmp / "site"
    version_py = b"__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n"
    cuda_lib = build_elf({".nv_fatbin": fatbin_container([("sass", 80), ("sass", 90), ("ptx", 90)])})
    write_dist_info(site, "torch", "2.11.0+cu130", {
        "torch/__init__.py": b"", "torch/version.py": version_py,
        "torch/lib/libtorch_python.so": build_elf({".rodata": rodata}),
        "torch/lib/libtorch_cuda.so": cuda_lib})
    return probe.find_distributions(probe.Options(site_packages=[str(site)]))


def test_static_arch_list_is_the_builds_arch_flags(tmp_path):
    """torch.cuda.get_arch_list() is a constant in libtorch_python.so (checked by hand against
    torch 2.11.0+cu130's wheel: 'sm_75 sm_80 sm_86 sm_90 sm_100 sm_120', what the H200 reported
    on import); the static probe reads that string, not the fatbin's per-kernel extras."""
    rodata = b"\0unrelated sm_70 text\0sm_75 sm_80 sm_86 sm_90 sm_100 sm_120\0%s: sm_%d\0"
    t = probe.torch_static(_cuda_torch(tmp_path, rodata), [], None)
    assert t["version"] == "2.11.0+cu130" and t["cuda"] == "13.0"
    assert t["arch_list"] == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert t["arch_source"].startswith("libtorch_python.so")


def test_static_arch_list_falls_back_to_the_fatbin(tmp_path):
    t = probe.torch_static(_cuda_torch(tmp_path, b"\0no flags here\0"), [], None)
    assert t["arch_list"] == ["sm_80", "sm_90", "compute_90"]
    assert t["arch_source"].startswith("libtorch_cuda.so")


def test_static_cuda_available_follows_gpu_and_driver(tmp_path):
    dists = _cuda_torch(tmp_path, b"\0sm_90\0")
    gpu = [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]
    assert probe.torch_static(dists, gpu, {"cuda_version": "13.0"})["cuda_available"] is True
    assert probe.torch_static(dists, gpu, {"cuda_version": "12.8"})["cuda_available"] is False
    assert probe.torch_static(dists, gpu, None)["cuda_available"] is None
    assert probe.torch_static(dists, [], {"cuda_version": "13.0"})["cuda_available"] is False


@needs_gcc
def test_static_probe_code_runs_on_python_38(tmp_path):
    """The probe must run on the oldest Python a target may have: drive every static path
    (torch facts, link check, arch flags) with Python 3.8 over a fake site-packages."""
    pythons = sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python3"))
    if not pythons:
        pytest.skip("no Python 3.8 interpreter on this machine")
    lib, _, bad = _libs(tmp_path)
    site = _site(tmp_path, lib, bad, "12.8")
    env = dict(os.environ, FASTPATH_PROBE_SITE_PACKAGES=str(site), FASTPATH_PROBE_SKIP="rpm",
               PYTHONPATH="")
    out = subprocess.run([pythons[0], "-", "--static"], input=Path(probe.__file__).read_bytes(),
                         capture_output=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    facts = json.loads(out.stdout)
    assert facts["host"]["python"].startswith("3.8")
    assert facts["torch"]["cuda"] == "12.8" and facts["torch"]["source"].startswith("static")
    assert facts["packages"]["causal-conv1d"]["import"]["error_kind"] == "abi-mismatch"
    assert facts["probe"]["errors"].keys() <= {"gpus"}
