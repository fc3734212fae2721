"""ELF + fatbin reader on ELF files built by the tests (struct, and gcc + objcopy)."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
from fakeenv import build_elf, fatbin_container, fatbin_entry

from fastpath.doctor.probe import (
    FatbinError,
    arch_number,
    arch_runs_on,
    elf_sections,
    parse_fatbin,
    read_fatbin_archs,
)


def test_sm80_cubin_and_compute90_ptx(tmp_path):
    so = tmp_path / "ext.so"
    so.write_bytes(build_elf({".nv_fatbin": fatbin_container([("sass", 80), ("ptx", 90)])}))
    assert read_fatbin_archs(str(so)) == {
        "sass": ["sm_80"],
        "ptx": ["compute_90"],
        "sections": [".nv_fatbin"],
    }


def test_struct_built_elf_is_valid_for_binutils(tmp_path):
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("binutils readelf not installed")
    so = tmp_path / "ext.so"
    so.write_bytes(build_elf({".nv_fatbin": fatbin_container([("sass", 80)])}))
    out = subprocess.run([readelf, "-S", str(so)], capture_output=True, text=True, check=True)
    assert ".nv_fatbin" in out.stdout
    assert set(elf_sections(str(so))) == {".nv_fatbin", ".shstrtab"}


def test_several_containers_with_padding_and_relfatbin(tmp_path):
    blob = fatbin_container([("sass", 90), ("sass", 120)]) + b"\0" * 8
    blob += fatbin_container([("ptx", 120), ("sass", 100)])
    so = tmp_path / "multi.so"
    so.write_bytes(
        build_elf({".nv_fatbin": blob, "__nv_relfatbin": fatbin_container([("sass", 86)])})
    )
    r = read_fatbin_archs(str(so))
    assert r["sass"] == ["sm_86", "sm_90", "sm_100", "sm_120"]
    assert r["ptx"] == ["compute_120"]


def test_no_device_code(tmp_path):
    so = tmp_path / "plain.so"
    so.write_bytes(build_elf({".text": b"\x90" * 16}))
    assert read_fatbin_archs(str(so)) == {"sass": [], "ptx": [], "sections": []}


def test_gcc_objcopy_built_shared_object(tmp_path):
    gcc, objcopy = shutil.which("gcc"), shutil.which("objcopy")
    if gcc is None or objcopy is None:
        pytest.skip("gcc/objcopy not installed")
    src = tmp_path / "k.c"
    src.write_text("int kernel_stub(void) { return 42; }\n")
    so = tmp_path / "k.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    blob = tmp_path / "fatbin.bin"
    blob.write_bytes(fatbin_container([("sass", 90), ("ptx", 90)]))
    subprocess.run(
        [objcopy, "--add-section", f".nv_fatbin={blob}", str(so)], check=True
    )
    assert read_fatbin_archs(str(so))["sass"] == ["sm_90"]
    assert read_fatbin_archs(str(so))["ptx"] == ["compute_90"]


@pytest.mark.parametrize(
    "blob, message",
    [
        (struct.pack("<IHHQ", 0xDEADBEEF, 1, 16, 0), "bad fatbin magic"),
        (struct.pack("<IHHQ", 0xBA55ED50, 2, 16, 0), "unknown fatbin container version"),
        (struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 4096) + b"\1" * 32, "runs past"),
        (
            struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 88)
            + fatbin_entry("sass", 80)[:0]
            + struct.pack("<HHIQ", 7, 0x101, 64, 24)
            + b"\0" * 80,
            "unknown fatbin entry kind",
        ),
        (b"\x50\xed\x55", "truncated fatbin container"),
    ],
)
def test_unknown_layouts_are_rejected(blob, message):
    with pytest.raises(FatbinError, match=message):
        parse_fatbin(blob)


def test_non_elf_and_big_endian_rejected_or_read(tmp_path):
    bad = tmp_path / "notelf.so"
    bad.write_bytes(b"MZ" + b"\0" * 100)
    with pytest.raises(FatbinError, match="not an ELF"):
        read_fatbin_archs(str(bad))
    weird = tmp_path / "weird.so"
    weird.write_bytes(b"\x7fELF" + bytes([3, 1, 1]) + b"\0" * 100)
    with pytest.raises(FatbinError, match="unknown ELF class"):
        read_fatbin_archs(str(weird))


def test_arch_helpers():
    assert arch_number("9.0") == 90
    assert arch_number("12.0") == 120
    assert arch_number("sm_120") == 120
    assert arch_number("compute_90") == 90
    assert arch_number("sm_90a") == 90
    assert arch_number("gpu") is None
    # SASS: same major, minor >= built minor
    assert arch_runs_on(["sm_80"], [], "8.6") == (True, "SASS sm_80")
    assert arch_runs_on(["sm_86"], [], "8.0")[0] is False
    assert arch_runs_on(["sm_90"], [], "12.0")[0] is False
    # PTX JITs forward
    assert arch_runs_on(["sm_80"], ["compute_90"], "12.0") == (True, "PTX compute_90 (JIT at load)")
    assert arch_runs_on([], ["compute_120"], "9.0")[0] is False
    assert arch_runs_on(["sm_90"], [], None) == (None, "device capability unknown")


def test_lto_ir_entries_are_known_but_not_runnable(tmp_path):
    so = tmp_path / "lto.so"
    so.write_bytes(build_elf({".nv_fatbin": fatbin_container([("nvvm-ir", 90), ("sass", 80)])}))
    assert read_fatbin_archs(str(so))["sass"] == ["sm_80"]
    assert read_fatbin_archs(str(so))["ptx"] == []


def test_arch_specific_and_family_variants():
    assert arch_number("sm_100f") == 100
    assert arch_runs_on(["sm_90a"], [], "9.0") == (True, "SASS sm_90a")
    assert arch_runs_on(["sm_90a"], [], "9.1")[0] is False  # arch-specific: exactly 9.0
    assert arch_runs_on(["sm_100f"], [], "10.3") == (True, "SASS sm_100f")
    assert arch_runs_on(["sm_100f"], [], "12.0")[0] is False
    assert arch_runs_on([], ["compute_90a"], "10.0")[0] is False


def test_real_nvcc_built_shared_object(tmp_path):
    """Cross-check on device code NVIDIA's own compiler wrote (no GPU needed to compile)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    src = tmp_path / "k.cu"
    src.write_text("__global__ void add1(float *x) { x[threadIdx.x] += 1.0f; }\n"
                   'extern "C" void launch(float *x) { add1<<<1, 32>>>(x); }\n')
    so = tmp_path / "k.so"
    gencodes = ["arch=compute_80,code=sm_80", "arch=compute_90,code=compute_90",
                "arch=compute_90a,code=sm_90a", "arch=compute_100f,code=sm_100f"]
    cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", str(so), str(src)]
    for g in gencodes:
        cmd += ["-gencode", g]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"this nvcc cannot build the test kernel: {r.stderr.strip()[-200:]}")
    archs = read_fatbin_archs(str(so))
    assert archs["sass"] == ["sm_80", "sm_90a", "sm_100f"]
    assert archs["ptx"] == ["compute_90"]
