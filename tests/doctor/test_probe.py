"""The probe on fake environments (temp trees, fake tools, dist-info, ELF files) and the real one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakeenv import (
    build_elf,
    fatbin_container,
    write_dist_info,
    write_dpkg_status,
    write_fake_nvcc,
    write_fake_nvidia_smi,
    write_script,
)

from fastpath.doctor import probe

PROBE_FILE = Path(probe.__file__)


def _base_env(tmp_path: Path, path_dirs: list[Path]) -> dict[str, str]:
    # Only our fake dirs plus the basic system dirs for `sh`/`cat`; HOME for Python.
    return {
        "PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path),
    }


@pytest.fixture
def fake_tree(tmp_path):
    """A machine with nvcc in five places, a ptxas-only cu12 wheel, dpkg records and a GPU."""
    root = tmp_path / "root"
    site = tmp_path / "site-packages"
    conda = tmp_path / "conda"
    bindir = tmp_path / "bin"
    cuda128 = root / "usr/local/cuda-12.8"
    write_fake_nvcc(cuda128 / "bin", "12.8")
    (cuda128 / "include").mkdir(parents=True)
    (cuda128 / "include/cuda_runtime.h").write_text("/* fake */\n")
    (root / "usr/local/cuda").symlink_to(cuda128)
    write_fake_nvcc(root / "usr/bin", "12.8")  # Debian nvidia-cuda-toolkit
    write_fake_nvcc(conda / "bin", "12.8")
    write_fake_nvcc(site / "nvidia/cu13/bin", "13.0")
    (site / "nvidia/cuda_nvcc/bin").mkdir(parents=True)
    (site / "nvidia/cuda_nvcc/bin/ptxas").write_bytes(b"\x7fELF fake ptxas")
    write_dist_info(site, "nvidia-cuda-nvcc-cu12", "12.8.93", {})
    write_dist_info(
        site,
        "causal-conv1d",
        "1.6.1",
        {
            "causal_conv1d/__init__.py": b"",
            "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": build_elf(
                {".nv_fatbin": fatbin_container([("sass", 80), ("ptx", 90)])}
            ),
        },
    )
    (site / "nvidia/cuda_nvrtc/lib").mkdir(parents=True)
    (site / "nvidia/cuda_nvrtc/lib/libnvrtc.so.12").write_bytes(b"")
    write_dpkg_status(
        root / "var/lib/dpkg/status",
        [("cuda-nvcc-12-8", "12.8.93-1"), ("nvidia-cuda-toolkit", "12.4.131~12.4.1-1")],
        nvcc_paths={"cuda-nvcc-12-8": "/usr/local/cuda-12.8/bin/nvcc"},
    )
    write_fake_nvidia_smi(
        bindir, [{"name": "NVIDIA RTX PRO 6000 Blackwell", "cc": "12.0", "mib": 97887}],
        "575.57.08", "12.9",
    )
    env = _base_env(tmp_path, [bindir, cuda128 / "bin"])
    env.update({"CONDA_PREFIX": str(conda), "CUDA_PATH": str(root / "opt/elsewhere"),
                "HF_TOKEN": "hf_secret", "TORCH_CUDA_ARCH_LIST": "12.0"})
    return {"root": root, "site": site, "env": env, "conda": conda, "cuda128": cuda128}


def test_collect_finds_every_nvcc_and_says_how(fake_tree):
    facts = probe.collect(
        env=fake_tree["env"], root=str(fake_tree["root"]),
        site_packages=[str(fake_tree["site"])], skip=["imports"],
    )
    assert facts["schema"] == "fastpath.facts/1"
    cands = {c["realpath"]: c for c in facts["nvcc_candidates"]}
    cuda128 = os.path.realpath(fake_tree["cuda128"] / "bin/nvcc")
    c128 = cands[cuda128]
    assert c128["version"] == "12.8.93" and c128["major"] == 12
    assert set(c128["found_by"]) >= {"PATH", "/usr/local/cuda", "/usr/local/cuda-*"}
    assert any(f.startswith("dpkg cuda-nvcc-12-8") for f in c128["found_by"])
    usr_bin = cands[os.path.realpath(fake_tree["root"] / "usr/bin/nvcc")]
    assert usr_bin["found_by"][0].startswith("/usr/bin")
    assert any(f.startswith("dpkg nvidia-cuda-toolkit") for f in usr_bin["found_by"])
    conda = cands[os.path.realpath(fake_tree["conda"] / "bin/nvcc")]
    assert conda["found_by"] == ["CONDA_PREFIX"]
    cu13 = cands[os.path.realpath(fake_tree["site"] / "nvidia/cu13/bin/nvcc")]
    assert cu13["version"] == "13.0.88" and cu13["major"] == 13
    ptxas = [c for c in facts["nvcc_candidates"] if c["kind"] == "ptxas-only-wheel"]
    assert len(ptxas) == 1 and ptxas[0]["version"] == "12.8.93"
    assert "ptxas only" in ptxas[0]["found_by"][0]

    # torch's CUDA_HOME rule: CUDA_PATH (set, stale) wins over PATH's nvcc
    home = facts["cuda_home"]
    assert home["torch_would_use"].endswith("opt/elsewhere")
    assert home["how"] == "CUDA_PATH env"
    assert home["has_nvcc"] is False

    assert [d["name"] for d in facts["package_db"]["dpkg"]] == [
        "cuda-nvcc-12-8", "nvidia-cuda-toolkit",
    ]
    gpu = facts["gpus"][0]
    assert gpu["compute_capability"] == "12.0" and gpu["memory_mib"] == 97887
    assert facts["driver"] == {"version": "575.57.08", "cuda_version": "12.9",
                               "source": facts["driver"]["source"]}
    cc = facts["packages"]["causal-conv1d"]
    assert cc["version"] == "1.6.1"
    (so,) = cc["so_files"]
    assert so["sass"] == ["sm_80"] and so["ptx"] == ["compute_90"]
    assert facts["nvrtc"][0]["path"].endswith("libnvrtc.so.12")
    assert facts["env"]["HF_TOKEN"] == "<redacted>"
    assert facts["env"]["TORCH_CUDA_ARCH_LIST"] == "12.0"


def test_cuda_home_from_path_and_headers(fake_tree):
    env = dict(fake_tree["env"])
    del env["CUDA_PATH"]
    facts = probe.collect(env=env, root=str(fake_tree["root"]),
                          site_packages=[str(fake_tree["site"])], skip=["imports", "nvidia-smi"])
    home = facts["cuda_home"]
    # first nvcc on PATH is the fake bin dir? no: bindir has only nvidia-smi -> cuda-12.8/bin
    assert home["torch_would_use"] == str(fake_tree["cuda128"])
    assert home["how"].startswith("dirname(dirname(which nvcc))")
    assert home["has_nvcc"] is True
    assert home["headers"] == {"cuda_runtime.h": True, "cusparse.h": False}
    assert home["nvcc_version"] == "12.8.93"
    assert home["diverge"] is False


def test_divergent_cuda_home_and_cuda_path(fake_tree, tmp_path):
    env = dict(fake_tree["env"], CUDA_HOME=str(fake_tree["cuda128"]))
    facts = probe.collect(env=env, root=str(fake_tree["root"]),
                          site_packages=[str(fake_tree["site"])], skip=["imports", "nvidia-smi"])
    assert facts["cuda_home"]["diverge"] is True
    assert facts["cuda_home"]["how"] == "CUDA_HOME env"


def test_failed_probe_is_reported_without_hiding_others(fake_tree):
    env = dict(fake_tree["env"])
    broken_bin = Path(env["HOME"]) / "broken"
    write_script(broken_bin / "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    env["PATH"] = os.pathsep.join([str(broken_bin), env["PATH"]])
    facts = probe.collect(env=env, root=str(fake_tree["root"]),
                          site_packages=[str(fake_tree["site"])], skip=["imports"])
    assert facts["probe"]["errors"]["gpus"].startswith("could not collect:")
    assert "exited 9" in facts["probe"]["errors"]["gpus"]
    assert facts["nvcc_candidates"]  # the rest is still there
    assert facts["packages"]["causal-conv1d"]["version"] == "1.6.1"


def test_abi_mismatch_import_is_classified(tmp_path):
    """A real extension with an undefined C++ symbol, imported by the probe in a subprocess."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    site = tmp_path / "site"
    src = tmp_path / "ext.c"
    src.write_text(
        "extern void _ZN3c107WarningC1Ev(void);\n"
        "void *PyInit_causal_conv1d_cuda(void) { _ZN3c107WarningC1Ev(); return 0; }\n"
    )
    so = tmp_path / "ext.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    write_dist_info(
        site, "causal-conv1d", "1.6.1",
        {"causal_conv1d/__init__.py": b"import causal_conv1d_cuda\n",
         "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": so.read_bytes()},
    )
    ext_suffix = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    (site / f"causal_conv1d_cuda{ext_suffix}").write_bytes(so.read_bytes())
    env = dict(os.environ, PYTHONPATH=str(site))
    r = probe.probe_import("causal_conv1d", probe.Options(env=env, site_packages=[str(site)]))
    assert r["ok"] is False
    assert r["error_kind"] == "abi-mismatch"
    assert "undefined symbol" in r["error"]
    missing = probe.probe_import("no_such_module_xyz", probe.Options(env=env))
    assert missing["error_kind"] == "not-installed"


def test_classify_import_error():
    c = probe.classify_import_error
    assert c("ImportError: x.so: undefined symbol: _ZN3c10") == "abi-mismatch"
    assert c("ModuleNotFoundError: No module named 'fla'") == "not-installed"
    assert c("RuntimeError: CUDA driver initialization failed") == "cuda-init"
    assert c("SyntaxError: bad") == "other"


def test_probe_runs_from_stdin_and_prints_json(tmp_path):
    """`python3 - < probe.py` with nothing but the stdlib: the remote path."""
    env = dict(os.environ, FASTPATH_PROBE_SKIP="imports,rpm", PYTHONPATH="")
    out = subprocess.run(
        [sys.executable, "-I", "-"], input=PROBE_FILE.read_bytes(), capture_output=True,
        env=env, timeout=120, check=True,
    )
    facts = json.loads(out.stdout)
    assert facts["schema"] == "fastpath.facts/1"
    assert facts["host"]["python"].count(".") == 2
    for key in ("gpus", "nvcc_candidates", "cuda_home", "packages", "package_db", "env"):
        assert key in facts


def test_probe_finds_dists_installed_with_pip_target_on_pythonpath(tmp_path):
    """`pip install --target DIR` + PYTHONPATH=DIR: the package's dist-info (version, .so files)
    must be found there, not only its module (seen on the H200: version None, no archs)."""
    target = tmp_path / "target"
    so = build_elf({".nv_fatbin": fatbin_container([("sass", 90), ("ptx", 90)])})
    write_dist_info(target, "causal-conv1d", "1.7.0", {
        "causal_conv1d/__init__.py": b"__version__ = '1.7.0'\n",
        "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": so,
    })
    env = dict(os.environ, FASTPATH_PROBE_SKIP="rpm,nvcc", PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-"], input=PROBE_FILE.read_bytes(), capture_output=True,
                         env=env, timeout=120, check=True)
    pkg = json.loads(out.stdout)["packages"]["causal-conv1d"]
    assert pkg["version"] == "1.7.0"
    assert [s["sass"] for s in pkg["so_files"]] == [["sm_90"]]
    assert [s["ptx"] for s in pkg["so_files"]] == [["compute_90"]]


def test_real_machine_probe_sees_this_workplace_nvcc():
    """This workplace (and CI) has nvcc 13.0 at /usr/local/bin/nvcc from /usr/local/cuda-13.0."""
    if not os.path.exists("/usr/local/cuda-13.0/bin/nvcc"):
        pytest.skip("not this workplace image: no /usr/local/cuda-13.0")
    facts = probe.collect(skip=["imports", "rpm"])
    versions = {c["version"] for c in facts["nvcc_candidates"] if c["kind"] == "nvcc"}
    assert "13.0.88" in versions


def _can_unshare() -> str | None:
    if os.geteuid() != 0:
        return "needs root for a mount namespace"
    if shutil.which("unshare") is None:
        return "unshare not installed"
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare -m failed: {r.stderr.strip()}"
    return None


@pytest.mark.root
def test_no_nvcc_anywhere_in_a_mount_namespace(tmp_path):
    """Hide the real CUDA 13.0 and the /usr/local/bin/nvcc wrapper: a real 'no nvcc' machine."""
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    empty_file = tmp_path / "empty-file"
    empty_file.write_text("")
    binds = []
    for target in ("/usr/local/cuda-13.0", "/usr/local/cuda"):
        if os.path.isdir(target) and not os.path.islink(target):
            binds.append(f"mount --bind {empty_dir} {target}")
    for target in ("/usr/local/bin/nvcc", "/usr/bin/nvcc"):
        if os.path.isfile(target):
            binds.append(f"mount --bind {empty_file} {target}")
    script = " && ".join([*binds, f"exec {sys.executable} -I - "])
    env = dict(os.environ, FASTPATH_PROBE_SKIP="imports,rpm")
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], input=PROBE_FILE.read_bytes(),
        capture_output=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()
    facts = json.loads(out.stdout)
    assert [c for c in facts["nvcc_candidates"] if c["kind"] == "nvcc"] == []
    assert facts["cuda_home"]["has_nvcc"] is False


def test_probe_runs_on_python_38_without_torch():
    """The probe must stay runnable by the oldest Python a target may have (3.8)."""
    import glob

    pythons = sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python3"))
    if not pythons:
        pytest.skip("no Python 3.8 interpreter on this machine")
    out = subprocess.run(
        [pythons[0], "-"], input=PROBE_FILE.read_bytes(), capture_output=True, timeout=120,
        env=dict(os.environ, FASTPATH_PROBE_SKIP="rpm", PYTHONPATH=""),
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    facts = json.loads(out.stdout)
    assert facts["host"]["python"].startswith("3.8")
    assert facts["torch"] is None and "torch" not in facts["probe"]["errors"]
    assert facts["packages"]["torch"]["import"]["error_kind"] == "not-installed"


def test_rpm_database_is_a_candidate_source(fake_tree):
    env = dict(fake_tree["env"])
    rpm_bin = Path(env["HOME"]) / "rpmbin"
    write_script(rpm_bin / "rpm", 'echo "cuda-nvcc-12-8 12.8.93"\necho "cuda-toolkit-12-8 12.8.1"\n')
    env["PATH"] = os.pathsep.join([str(rpm_bin), env["PATH"]])
    facts = probe.collect(env=env, root=str(fake_tree["root"]),
                          site_packages=[str(fake_tree["site"])], skip=["imports", "nvidia-smi"])
    assert {"name": "cuda-nvcc-12-8", "version": "12.8.93"} in facts["package_db"]["rpm"]
    c128 = next(c for c in facts["nvcc_candidates"]
                if c["realpath"] == os.path.realpath(fake_tree["cuda128"] / "bin/nvcc"))
    assert "rpm cuda-nvcc-12-8 12.8.93" in c128["found_by"]


def test_hanging_import_times_out_without_hanging_the_probe(tmp_path):
    site = tmp_path / "site"
    write_dist_info(site, "tilelang", "0.1.15",
                    {"tilelang/__init__.py": b"import time\ntime.sleep(60)\n"})
    env = dict(os.environ, PYTHONPATH=str(site))
    r = probe.probe_import("tilelang", probe.Options(env=env, timeout=1.5))
    assert r["ok"] is False and r["error_kind"] == "other"
    assert "timed out" in r["error"]
