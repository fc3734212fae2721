"""Builders for fake ENVIRONMENTS (not mocks): real files the real probe reads.

- fake `nvcc` / `nvidia-smi` shell scripts that print the real tools' output formats,
- dist-info folders with METADATA + RECORD,
- ELF shared objects with a `.nv_fatbin` section holding fatbin containers (built with struct),
- dpkg status files (+ info/<pkg>.list).
Other helpers' tests may reuse these.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import struct
from pathlib import Path

# Verbatim `nvcc --version` outputs. 13.0: this workplace's /usr/local/cuda-13.0/bin/nvcc.
# 12.8: CUDA 12.8 Update 1 (V12.8.93) as printed by cuda-nvcc-12-8.
NVCC_VERSION_TEXT = {
    "12.8": (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Fri_Feb_21_20:23:50_PST_2025\n"
        "Cuda compilation tools, release 12.8, V12.8.93\n"
        "Build cuda_12.8.r12.8/compiler.35583870_0\n"
    ),
    "13.0": (
        "nvcc: NVIDIA (R) Cuda compiler driver\n"
        "Copyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\n"
        "Cuda compilation tools, release 13.0, V13.0.88\n"
        "Build cuda_13.0.r13.0/compiler.36424714_0\n"
    ),
}


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_fake_nvcc(bin_dir: Path, version: str) -> Path:
    """A `nvcc` that prints the real `--version` text of CUDA `version` ("12.8" or "13.0")."""
    text = NVCC_VERSION_TEXT[version]
    return write_script(bin_dir / "nvcc", f"cat <<'EOF'\n{text}EOF\n")


def write_fake_nvidia_smi(bin_dir: Path, gpus: list[dict], driver: str, cuda: str) -> Path:
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` CSV, and the plain header."""
    rows = "".join(
        f"{i}, {g['name']}, {driver}, {g['cc']}, {g['mib']}\n" for i, g in enumerate(gpus)
    )
    header = (
        "+-----------------------------------------------------------------------------+\n"
        f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}     |\n"
    )
    body = (
        'case "$1" in\n'
        f"  --query-gpu=*) cat <<'EOF'\n{rows}EOF\n  ;;\n"
        f"  *) cat <<'EOF'\n{header}EOF\n  ;;\n"
        "esac\n"
    )
    return write_script(bin_dir / "nvidia-smi", body)


def write_dist_info(site: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """Install `files` (relative to site) plus a dist-info with METADATA and RECORD."""
    site.mkdir(parents=True, exist_ok=True)
    dist_dir = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_dir.mkdir()
    (dist_dir / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record_lines = []
    for rel, data in files.items():
        target = site / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{rel},sha256={digest},{len(data)}")
    rel_dist = dist_dir.name
    record_lines += [f"{rel_dist}/METADATA,,", f"{rel_dist}/RECORD,,"]
    (dist_dir / "RECORD").write_text("\n".join(record_lines) + "\n")
    return dist_dir


def fatbin_entry(kind: str, arch: int, payload: bytes = b"\xab" * 24) -> bytes:
    """One fatbin entry: 64-byte header (u16 kind 1=PTX 2=cubin, u32 arch at 28) + payload."""
    header = struct.pack(
        "<HHIQIIHHIIIQQQ",
        {"ptx": 1, "sass": 2, "nvvm-ir": 8}[kind],  # kind
        0x0101,  # unknown, observed constant
        64,  # header size
        len(payload),  # payload size
        0,  # compressed size
        0,  # unknown
        arch % 10,  # minor
        arch // 10,  # major
        arch,  # arch at offset 28
        0,  # name offset
        0,  # name length
        0,  # flags
        0,  # zero
        0,  # decompressed size
    )
    assert len(header) == 64 and struct.unpack_from("<I", header, 28)[0] == arch
    return header + payload


def fatbin_container(entries: list[tuple[str, int]]) -> bytes:
    """A fatbin container (magic 0xBA55ED50, version 1, header 16) holding `entries`."""
    body = b"".join(fatbin_entry(kind, arch) for kind, arch in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def build_elf(sections: dict[str, bytes]) -> bytes:
    """A minimal valid ELF64 little-endian shared object (x86-64) with the given sections."""
    names = b"\0"
    name_off = {}
    for name in [*sections, ".shstrtab"]:
        name_off[name] = len(names)
        names += name.encode() + b"\0"
    blobs = [*sections.values(), names]
    offset = 64
    layout = []
    data = b""
    for blob in blobs:
        pad = (-offset) % 8
        data += b"\0" * pad
        offset += pad
        layout.append((offset, len(blob)))
        data += blob
        offset += len(blob)
    pad = (-offset) % 8
    data += b"\0" * pad
    shoff = offset + pad
    shnum = len(blobs) + 1
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    ehdr += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1)
    shdrs = b"\0" * 64
    for (name, (off, size)) in zip([*sections, ".shstrtab"], layout, strict=True):
        sh_type = 3 if name == ".shstrtab" else 1  # STRTAB / PROGBITS
        shdrs += struct.pack("<IIQQQQIIQQ", name_off[name], sh_type, 0, 0, off, size, 0, 0, 8, 0)
    return ehdr + data + shdrs


def write_dpkg_status(status: Path, packages: list[tuple[str, str]], nvcc_paths=None) -> Path:
    """A dpkg status DB with `packages` installed; info/<pkg>.list lists each nvcc path given."""
    status.parent.mkdir(parents=True, exist_ok=True)
    stanzas = [
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n"
    ]
    for name, version in packages:
        stanzas.append(
            f"Package: {name}\nStatus: install ok installed\nPriority: optional\n"
            f"Architecture: amd64\nVersion: {version}\nDescription: fake {name}\n"
            " multi-line description continues here\n"
        )
    status.write_text("\n".join(stanzas))
    info = status.parent / "info"
    info.mkdir(exist_ok=True)
    for pkg, path in (nvcc_paths or {}).items():
        (info / f"{pkg}.list").write_text(f"/.\n{os.path.dirname(path)}\n{path}\n")
    return status


def _pkg(version=None, ok=False, kind="not-installed", error=None, so_files=()):
    return {
        "version": version,
        "import": {"ok": ok, "error_kind": None if ok else kind,
                   "error": None if ok else (error or "No module named ...")},
        "so_files": list(so_files),
        "source": "fake",
    }


def seed_facts() -> dict:
    """The story's machine as a facts dict: torch 2.11+cu128 on an sm_120 GPU, fla installed,
    causal-conv1d absent, no nvcc anywhere, transformers 5.17, Triton with a CUDA backend."""
    return {
        "schema": "fastpath.facts/1",
        "probe": {"kind": "python", "python": "3.12.3", "errors": {}, "seconds": 1.2,
                  "options": {"site_packages": ["/usr/local/lib/python3.12/dist-packages"],
                              "dpkg_status": "/var/lib/dpkg/status"}},
        "host": {"hostname": "gpu-node", "os": "Ubuntu 24.04.2 LTS", "kernel": "6.8.0",
                 "arch": "x86_64", "glibc": "glibc 2.39", "python": "3.12.3", "source": "fake"},
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"},
        "gpus": [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                  "driver": "575.57.08", "compute_capability": "12.0", "memory_mib": 97887,
                  "source": "nvidia-smi"} for i in range(8)],
        "driver": {"version": "575.57.08", "cuda_version": "12.9", "source": "nvidia-smi"},
        "torch": {"version": "2.11.0+cu128", "cuda": "12.8",
                  "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120",
                                "compute_120"],
                  "cxx11_abi": True, "cuda_available": True, "device_arch_covered": True,
                  "source": "import torch"},
        "triton": {"version": "3.6.0", "gpu_backend": True, "backends": ["amd", "nvidia"],
                   "source": "import triton"},
        "nvrtc": [{"path": "/usr/local/lib/python3.12/dist-packages/nvidia/cuda_nvrtc/lib/"
                           "libnvrtc.so.12", "version": "12.8.93", "source": "file"}],
        "nvcc_candidates": [],
        "cuda_home": {"torch_would_use": None, "how": "nothing found: torch's CUDA_HOME is None",
                      "has_nvcc": False, "headers": {"cuda_runtime.h": False, "cusparse.h": False},
                      "include_dir": None, "cuda_home_env": None, "cuda_path_env": None,
                      "diverge": False},
        "package_db": {"dpkg": [], "rpm": [], "source": "/var/lib/dpkg/status"},
        "gcc": {"version": "13.3.0", "path": "/usr/bin/gcc", "source": "gcc"},
        "packages": {
            "causal-conv1d": _pkg(),
            "flash-linear-attention": _pkg(),
            "fla-core": _pkg("0.6.0", ok=True),
            "mamba-ssm": _pkg(),
            "flash-attn": _pkg(),
            "kernels": _pkg(),
            "tilelang": _pkg(),
            "transformers": _pkg("5.17.0", ok=True),
            "torch": _pkg("2.11.0+cu128", ok=True),
            "triton": _pkg("3.6.0", ok=True),
        },
    }


def write_fake_cuda_torch(site: Path, version: str = "2.11.0+cu130", cuda: str = "13.0",
                          archs: tuple[int, ...] = (75, 80, 86, 90, 100, 120)) -> Path:
    """A CUDA torch as the static probe reads it: dist-info, torch/version.py, and
    lib/libtorch_python.so holding the build's arch-flags string (`torch.cuda.get_arch_list()`)."""
    flags = " ".join(f"sm_{a}" for a in archs).encode()
    version_py = f"__version__ = {version!r}\ncuda: Optional[str] = {cuda!r}\n".encode()
    return write_dist_info(site, "torch", version.split("+")[0], {
        "torch/__init__.py": b"", "torch/version.py": version_py,
        "torch/lib/libtorch_python.so": build_elf({".rodata": b"\0" + flags + b"\0"}),
        "torch/lib/libtorch_cuda.so": build_elf({".nv_fatbin": fatbin_container(
            [("sass", a) for a in archs])})})


def write_story_site(site: Path, torch_version: str = "2.11.0+cu130", cuda: str = "13.0") -> Path:
    """The story's packages: CUDA torch, Triton 3.6.0 with its NVIDIA backend, fla-core 0.6.0,
    transformers 5.17.0; no causal-conv1d."""
    write_fake_cuda_torch(site, torch_version, cuda)
    write_dist_info(site, "triton", "3.6.0", {"triton/__init__.py": b"__version__ = '3.6.0'\n",
                                              "triton/backends/nvidia/__init__.py": b"",
                                              "triton/backends/amd/__init__.py": b""})
    write_dist_info(site, "fla-core", "0.6.0", {"fla/__init__.py": b"__version__ = '0.6.0'\n"})
    write_dist_info(site, "transformers", "5.17.0", {"transformers/__init__.py": b""})
    return site
