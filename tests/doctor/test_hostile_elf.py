"""The probe reads only regular files, with size caps, and reports every
malformed ELF as "could not read: ...". The crafted files are built here: a section-name table
without a NUL (killed the local doctor with ValueError), a sparse file claiming a 4 GB name table
(read it all: 4.2 GB RSS), FIFOs named like a .so or an .egg-info (hung the doctor forever)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakeenv import build_elf, fatbin_container, write_dist_info
from hostile_fakes import env, fastpath

from fastpath.doctor.probe import link_check, probe_so

GOOD = build_elf({".nv_fatbin": fatbin_container([("sass", 90)]), ".dynsym": b"\0" * 48,
                  ".dynstr": b"\0_ZN3c104impl3fooEv\0"})


def _shdr_at(data: bytes, index: int) -> int:
    shoff, = struct.unpack_from("<Q", data, 0x28)
    return shoff + 64 * index


def _names_index(data: bytes) -> int:
    return struct.unpack_from("<H", data, 0x3E)[0]


def _set_field(data: bytearray, index: int, field: str, value: int) -> None:
    offsets = {"name": (0, "<I"), "offset": (24, "<Q"), "size": (32, "<Q")}
    off, fmt = offsets[field]
    struct.pack_into(fmt, data, _shdr_at(bytes(data), index) + off, value)


def _no_nul_names() -> bytes:
    data = bytearray(GOOD)
    at = _shdr_at(GOOD, _names_index(GOOD))
    off, size = struct.unpack_from("<QQ", GOOD, at + 24)
    data[off:off + size] = bytes(size).replace(b"\0", b"A")
    return bytes(data)


def _variant(kind: str) -> bytes:
    data = bytearray(GOOD)
    if kind == "names-without-nul":
        return _no_nul_names()
    if kind == "truncated-header-table":
        return GOOD[:_shdr_at(GOOD, 2)]
    if kind == "tiny-shentsize":
        struct.pack_into("<H", data, 0x3A, 8)
    elif kind == "extended-count-huge":
        struct.pack_into("<H", data, 0x3C, 0)  # e_shnum 0: the count is section 0's size
        _set_field(data, 0, "size", 10**9)
    elif kind == "section-past-end":
        _set_field(data, 1, "size", 1 << 40)
    elif kind == "names-index-out-of-range":
        struct.pack_into("<H", data, 0x3E, 999)
    elif kind == "garbage-after-magic":
        return b"\x7fELF" + os.urandom(200)
    elif kind == "not-elf":
        return b"#!/bin/sh\necho hi\n"
    else:
        raise AssertionError(kind)
    return bytes(data)


KINDS = ["names-without-nul", "truncated-header-table", "tiny-shentsize", "extended-count-huge",
         "section-past-end", "names-index-out-of-range", "garbage-after-magic", "not-elf"]


def test_good_file_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "good.so"
    path.write_bytes(GOOD)
    assert probe_so(str(path))["sass"] == ["sm_90"]


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_elf_is_could_not_read(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.so"
    path.write_bytes(_variant(kind))
    result = probe_so(str(path))
    assert result["error"].startswith("could not read: "), result
    link = link_check(str(path), [])
    assert link["error"].startswith("could not read: "), link


def test_fifo_so_is_refused_without_blocking(tmp_path: Path) -> None:
    """In a subprocess with a timeout: opening a FIFO for reading blocks until a writer comes."""
    fifo = tmp_path / "ext.so"
    os.mkfifo(fifo)
    code = ("import json; from fastpath.doctor.probe import link_check, probe_so; "
            f"print(json.dumps([probe_so({str(fifo)!r}), link_check({str(fifo)!r}, [])]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(), timeout=60)
    so, link = json.loads(proc.stdout)
    assert "not a regular file" in so["error"] and "not a regular file" in link["error"]


def _sparse(path: Path, head: bytes, total: int) -> None:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(total)


@pytest.mark.parametrize("section", ["names", "dynstr"])
def test_sparse_file_claiming_4gb_is_not_read(tmp_path: Path, section: str) -> None:
    """A 4 KB sparse ELF whose table claims 4 GB: refused from the header, not read. Run under a
    1.5 GB address-space limit, so a reader that tried would fail instead of eating the host."""
    data = bytearray(GOOD)
    index = _names_index(GOOD) if section == "names" else 2  # sections: fatbin, dynsym, dynstr
    _set_field(data, index, "offset", 8192)
    _set_field(data, index, "size", 4 << 30)
    path = tmp_path / "sparse.so"
    _sparse(path, bytes(data), (4 << 30) + 16384)
    assert path.stat().st_blocks * 512 < (64 << 20)  # really sparse
    code = textwrap.dedent(f"""
        import json, resource
        resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
        from fastpath.doctor.probe import link_check, probe_so
        print(json.dumps([probe_so({str(path)!r}), link_check({str(path)!r}, [])]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    so, link = json.loads(proc.stdout)
    errors = so.get("error", "") + " " + link.get("error", "")
    assert "could not read" in errors and "implausibly large" in errors, (so, link)


def test_local_doctor_survives_crafted_site_packages(tmp_path: Path) -> None:
    """End to end: a kernel package whose RECORD lists a no-NUL .so and a FIFO .so, next to a
    FIFO named *.egg-info, in the site-packages the local doctor scans."""
    site = tmp_path / "site"
    write_dist_info(site, "causal-conv1d", "1.5.0", {
        "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": _no_nul_names(),
        "causal_conv1d/__init__.py": b"",
    })
    os.mkfifo(site / "causal_conv1d" / "fifo_ext.so")
    record = next(site.glob("*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "causal_conv1d/fifo_ext.so,,\n")
    os.mkfifo(site / "trap.egg-info")
    proc = fastpath("doctor", "--probe", "static", "--json", timeout=120, extra_env={
        "FASTPATH_PROBE_SITE_PACKAGES": str(site), "FASTPATH_PROBE_SKIP": "nvidia-smi,rpm"})
    report = json.loads(proc.stdout)
    # no GPU here: UNKNOWN (3) or BLOCKED (1) are verdicts; an "error" document would be a crash
    assert report["verdict"] != "error" and proc.returncode in (0, 1, 3), proc.stderr.decode()[-3000:]
    so_files = report["facts"]["packages"]["causal-conv1d"]["so_files"]
    assert len(so_files) == 2 and all(s["error"].startswith("could not read") for s in so_files)
