"""fastpath probe: gather the facts that decide whether a model's kernels can take the fast path.

ONE self-contained, stdlib-only file (Python >= 3.8). It never imports fastpath, so it can be
piped to any host or container: `python3 - < probe.py` prints ONE JSON object. Importing torch,
triton and the kernel packages happens only in a guarded `sys.executable` subprocess (torch imported
once, then each package in order; a fresh one after a step that crashes or hangs), run concurrently
with the filesystem probes, so a slow or crashing import cannot hang or kill the probe.
A probe that fails leaves its fact null and says why in `probe.errors[key]` ("could not collect:
<reason>") without hiding the others.

Facts schema ("fastpath.facts/1"; every fact says where it came from in `source`):
  schema: "fastpath.facts/1"
  probe:  {kind: "python", python, errors: {key: "could not collect: ..."}, seconds, options,
           import_seconds: {step: s}, import_interpreters: n}   # (the last two: full probe only;
           a remote sh fallback adds python_fallback: why)
  host:   {hostname, os, kernel, arch, glibc, python, executable, source}
  env:    {NAME: value} relevant variables only; names with TOKEN/SECRET/PASS/PWD/KEY/AUTH/
          CREDENTIAL are "<redacted>"
  gpus:   [{index, name, driver, compute_capability: "9.0", memory_mib, source}]
  driver: {version, cuda_version, source} | null
  torch:  {version, cuda, arch_list: ["sm_90", ...], cxx11_abi, cuda_available, devices,
           device_arch_covered: bool|null, source} | null
  triton: {version, gpu_backend: bool|null, backends: [...], source} | null
  nvrtc:  [{path, version, source}]            # libnvrtc = "JIT without nvcc"
  nvcc_candidates: [{path, realpath, paths, version, major, minor, found_by: [str],
           major_matches_torch: bool|null, kind: "nvcc"|"ptxas-only-wheel", source, error?}]
  cuda_home: {torch_would_use, how, has_nvcc, nvcc_version, headers: {"cuda_runtime.h": bool,
           "cusparse.h": bool}, include_dir, cuda_home_env, cuda_path_env, diverge: bool}
  package_db: {dpkg: [{name, version, status}], rpm: [{name, version}], source}
  gcc:    {version, path, source} | null
  packages: {dist: {version, module, import: {ok, error_kind: "not-installed"|"abi-mismatch"|
           "cuda-init"|"other"|null, error}, so_files: [{path, sass: ["sm_90", "sm_90a"],
           ptx: ["compute_90"], sections, error?}], source}}
           dists: causal-conv1d, flash-linear-attention, fla-core, mamba-ssm, flash-attn, kernels,
           tilelang, transformers, torch, triton, fastpath-kit, liger-kernel (torch/triton .so
           files are not scanned: huge; fastpath-kit and liger-kernel: dist-info only).
           mamba-ssm also has extension_modules: {"selective_scan_cuda": path | null} (its
           Mamba-1 CUDA scan; null where the package was installed without it).
  hub_kernels: {cache_dir, how, source,
           repos: {"kernels-community/fla": {path, refs: {"v3": commit},
                   snapshots: {commit: {variant: {metadata: bool, backend: {...} | null}}}}}}
           # the `kernels` library's Hub cache (KERNELS_CACHE, else HF_HUB_CACHE, else
           # HF_HOME/hub): what transformers' hub kernels can load without the network

Knobs (for tests and unusual hosts; the defaults probe the real machine):
  FASTPATH_PROBE_ROOT            prefix for system paths (/usr/local/cuda*, /opt, /usr/bin, /etc,
                                 /var/lib/dpkg); default "/"
  FASTPATH_PROBE_DPKG_STATUS     dpkg status file; default <root>/var/lib/dpkg/status
  FASTPATH_PROBE_SITE_PACKAGES   os.pathsep-separated site-packages dirs; default: this Python's
  FASTPATH_PROBE_SKIP            comma list of parts to skip: imports (torch/triton/package
                                 import subprocesses), nvidia-smi, rpm
  FASTPATH_PROBE_TIMEOUT         seconds per subprocess (default 30)
The ELF + fatbin reader (`read_fatbin_archs`) lives here so the probe stays one file; other code
imports it from `fastpath.doctor.probe`.
"""

from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import platform
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time

SCHEMA = "fastpath.facts/1"

# distribution -> import name. Order is the report order.
KERNEL_DISTS = [
    ("causal-conv1d", "causal_conv1d"),
    ("flash-linear-attention", "fla"),
    ("fla-core", "fla"),
    ("mamba-ssm", "mamba_ssm"),
    ("flash-attn", "flash_attn"),
    ("kernels", "kernels"),
    ("tilelang", "tilelang"),
    ("transformers", "transformers"),
]
# fastpath-kit: whether a remedy still has to say `pip install fastpath-kit` on the target.
# liger-kernel: whether Liger Kernel (composes with enable() in training) is installed.
VERSION_ONLY_DISTS = [("torch", "torch"), ("triton", "triton"), ("fastpath-kit", "fastpath"),
                      ("liger-kernel", "liger_kernel")]
# Drafter-training clients of `fastpath capture`: reported (version from dist-info, never imported)
# only where installed, for the doctor's known issues about them.
CLIENT_DISTS = [("speculators", "speculators"), ("specforge", "specforge")]

ENV_NAMES = (
    "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "PATH", "LD_LIBRARY_PATH", "CONDA_PREFIX",
    "VIRTUAL_ENV", "TORCH_CUDA_ARCH_LIST", "USE_HUB_KERNELS", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_PRODUCT_NAME", "NVIDIA_PYTORCH_VERSION", "CAUSAL_CONV1D_FORCE_BUILD",
    "MAX_JOBS", "CC", "CXX",
)
ENV_PREFIXES = ("TRITON_", "FLA_", "FASTPATH_", "KERNELS_", "LOCAL_KERNELS", "HF_", "TORCH_CUDA")
SECRET_MARKERS = ("TOKEN", "SECRET", "PASS", "PWD", "KEY", "AUTH", "CREDENTIAL")

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
# fatbinary.h FATBIN_KIND_*; 8 = NVVM IR (LTO), as named by NVIDIA's cubin tooling.
FATBIN_KINDS = {1: "ptx", 2: "sass", 4: "oldcubin", 8: "nvvm-ir"}
# Entry flag bits for the sm_XYa / sm_XYf variants. Measured on nvcc 13.0.88 (this workplace):
# sm_90 -> 0x11, sm_120a -> 0x1100011, sm_100f -> 0x1200011, sm_120 -> 0x1000011.
FATBIN_FLAG_ARCH_SPECIFIC = 0x100000
FATBIN_FLAG_FAMILY_SPECIFIC = 0x200000
NVCC_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+(?:\.\d+)*)")


# ---------------------------------------------------------------------------------------------
# ELF + fatbin reader
# ---------------------------------------------------------------------------------------------


class FatbinError(ValueError):
    """The file is not an ELF we understand, or its fatbin section has an unknown layout."""


# Whatever a crafted file can make the ELF/fatbin readers raise: reported as "could not read".
_MALFORMED = (ValueError, OSError, struct.error, IndexError, OverflowError, MemoryError)


class NotRegularFile(OSError):
    """A FIFO, socket or device where a file was expected: reading it could block forever."""


# Caps on what the ELF reader reads: a crafted (sparse) file can claim a 4 GB name table that
# costs no disk. Real values: a few hundred bytes of section names, < 256 section headers, and
# libtorch_cpu.so's .dynstr is ~5 MiB (CUDA builds a few times more).
MAX_SECTION_NAMES = 1 << 20
MAX_SECTION_HEADERS = 1 << 16
MAX_SYMBOL_TABLE = 64 << 20


def open_regular(path, text=False):
    """Open `path` for reading only if it is a regular file (stat before opening, and fstat on a
    non-blocking descriptor after, so a FIFO named `x.so`, `RECORD` or `y.egg-info` can neither
    block the open nor a read)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFile("not a regular file: %s" % path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("not a regular file: %s" % path)
        if text:
            return open(fd, "r", encoding="utf-8", errors="replace")
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text_capped(path, limit=4 << 20):
    """A small text file (metadata, version.py, os-release) read whole, at most `limit` chars."""
    with open_regular(path, text=True) as fh:
        return fh.read(limit)


def elf_sections(path):
    """Return {section name: (file offset, size)} of an ELF file (32/64-bit, little/big endian).

    Raises FatbinError for anything malformed (truncated tables, names without a NUL, tables
    larger than the caps above) and NotRegularFile for non-files."""
    with open_regular(path) as f:
        ident = f.read(64)
        if len(ident) < 52 or ident[:4] != b"\x7fELF":
            raise FatbinError("not an ELF file")
        ei_class, ei_data = ident[4], ident[5]
        if ei_class not in (1, 2) or ei_data not in (1, 2):
            raise FatbinError("unknown ELF class/data encoding (%d/%d)" % (ei_class, ei_data))
        end = "<" if ei_data == 1 else ">"
        if ei_class == 2:
            shoff, = struct.unpack_from(end + "Q", ident, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", ident, 0x3A)
            sh_fmt, sh_min = end + "IIQQQQIIQQ", 64
        else:
            shoff, = struct.unpack_from(end + "I", ident, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", ident, 0x2E)
            sh_fmt, sh_min = end + "IIIIIIIIII", 40
        if shoff == 0:
            return {}
        if shentsize < sh_min:
            raise FatbinError("ELF section header size %d is too small" % shentsize)
        file_size = os.fstat(f.fileno()).st_size

        def header(raw):
            fields = struct.unpack_from(sh_fmt, raw)
            # (name, type, flags, addr, offset, size, link, ...)
            return fields[0], fields[1], fields[4], fields[5], fields[6]

        f.seek(shoff)
        first_raw = f.read(sh_min)
        if len(first_raw) < sh_min:
            raise FatbinError("truncated ELF section header table")
        first = header(first_raw)
        if shnum == 0:  # extended numbering: the real count is in section 0's size
            shnum = first[3]
        if shstrndx == 0xFFFF:
            shstrndx = first[4]
        if shnum > MAX_SECTION_HEADERS or shstrndx >= shnum:
            raise FatbinError("implausible ELF section table (%d sections)" % shnum)
        if shoff + shnum * shentsize > file_size:
            raise FatbinError("truncated ELF section header table")
        f.seek(shoff)
        table = f.read(shnum * shentsize)
        if len(table) < shnum * shentsize:
            raise FatbinError("truncated ELF section header table")
        headers = [header(table[i * shentsize:i * shentsize + sh_min]) for i in range(shnum)]
        _, _, str_off, str_size, _ = headers[shstrndx]
        if str_size > MAX_SECTION_NAMES:
            raise FatbinError("section name table of %d bytes is implausibly large" % str_size)
        if str_off + str_size > file_size:
            raise FatbinError("section name table outside the file")
        f.seek(str_off)
        names = f.read(str_size)
        out = {}
        for name_off, sh_type, offset, size, _ in headers:
            if name_off >= len(names):
                continue
            stop = names.find(b"\0", name_off)
            if stop < 0:
                raise FatbinError("section name at %d has no terminating NUL" % name_off)
            name = names[name_off:stop].decode("latin-1")
            if sh_type in (0, 8):  # SHT_NULL, SHT_NOBITS: no bytes in the file
                continue
            if offset + size > file_size:
                raise FatbinError("section %s extends past the end of the file" % name[:64])
            out[name] = (offset, size)
        return out


def _fatbin_entries(read_at, n):
    """Walk concatenated fatbin containers of `n` bytes; read_at(pos, size) -> bytes.

    Reads only the headers and seeks over payloads, so a 1 GB extension costs a few KB of I/O.
    Layout (undocumented; see module docstring sources): container header u32 magic 0xBA55ED50,
    u16 version 1, u16 header_size, u64 entries_size; entries each with u16 kind (1 PTX,
    2 cubin, 4 old cubin, 8 NVVM IR), u16, u32 header_size, u64 payload_size, ..., u32 arch at
    offset 28, u64 flags at 40. Anything else raises FatbinError rather than guessing.
    """
    entries = []
    pos = 0
    while pos < n:
        chunk = read_at(pos, min(64, n - pos))
        skip = len(chunk) - len(chunk.lstrip(b"\0"))
        if skip:  # zero padding between containers
            pos += skip
            continue
        head = read_at(pos, 16)
        if len(head) < 16:
            raise FatbinError("truncated fatbin container header at %d" % pos)
        magic, version, hsize, esize = struct.unpack("<IHHQ", head)
        if magic != FATBIN_MAGIC:
            raise FatbinError("bad fatbin magic 0x%08x at %d" % (magic, pos))
        if version != 1 or hsize < 16:
            raise FatbinError("unknown fatbin container version %d / header %d" % (version, hsize))
        start, end = pos + hsize, pos + hsize + esize
        if end > n:
            raise FatbinError("fatbin container at %d runs past its section" % pos)
        epos = start
        while epos < end:
            eh = read_at(epos, min(48, end - epos))
            if len(eh) < 32:
                raise FatbinError("truncated fatbin entry at %d" % epos)
            kind, _, ehsize, payload = struct.unpack_from("<HHIQ", eh, 0)
            arch, = struct.unpack_from("<I", eh, 28)
            if kind not in FATBIN_KINDS:
                raise FatbinError("unknown fatbin entry kind %d at %d" % (kind, epos))
            if ehsize < 32 or epos + ehsize + payload > end:
                raise FatbinError("bad fatbin entry sizes at %d" % epos)
            flags, = struct.unpack_from("<Q", eh, 40) if ehsize >= 48 and len(eh) >= 48 else (0,)
            suffix = "a" if flags & FATBIN_FLAG_ARCH_SPECIFIC else (
                "f" if flags & FATBIN_FLAG_FAMILY_SPECIFIC else "")
            entries.append({"kind": FATBIN_KINDS[kind], "arch": arch, "suffix": suffix})
            epos += ehsize + payload
        pos = end
    return entries


def parse_fatbin(data):
    """Entries [{kind: "sass"|"ptx"|..., arch: int, suffix: ""|"a"|"f"}] of a fatbin blob."""
    return _fatbin_entries(lambda pos, size: data[pos:pos + size], len(data))


def read_fatbin_archs(path):
    """SASS and PTX archs embedded in a compiled CUDA .so, read from its ELF fatbin sections.

    Returns {"sass": ["sm_80", ...], "ptx": ["compute_90", ...], "sections": [...]}; empty lists
    when the file has no device code. Raises FatbinError for files it cannot read with certainty.
    """
    sections = elf_sections(path)
    sass, ptx, found = set(), set(), []
    with open_regular(path) as f:
        for name in FATBIN_SECTIONS:
            if name not in sections:
                continue
            offset, size = sections[name]

            def read_at(pos, n, _base=offset):
                f.seek(_base + pos)
                return f.read(n)

            for entry in _fatbin_entries(read_at, size):
                if entry["kind"] == "sass":
                    sass.add((entry["arch"], entry["suffix"]))
                elif entry["kind"] == "ptx":
                    ptx.add((entry["arch"], entry["suffix"]))
                # oldcubin / NVVM IR entries cannot run as they are: not counted
            found.append(name)
    return {
        "sass": ["sm_%d%s" % a for a in sorted(sass)],
        "ptx": ["compute_%d%s" % a for a in sorted(ptx)],
        "sections": found,
    }


# ---------------------------------------------------------------------------------------------
# ELF dynamic symbols: a link check that needs no import
# ---------------------------------------------------------------------------------------------
# An extension built against another torch fails `import` with "undefined symbol: _ZN3c10...":
# a c10/at/torch symbol it needs is not exported by the installed torch's libraries. The same check
# can be made from the files alone (what the loader would look up), without importing torch.

_TORCH_NAMESPACES = ("c10", "at", "torch", "caffe2")


def _elf_ident(f):
    ident = f.read(6)
    if len(ident) < 6 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise FatbinError("not an ELF file")
    return ident[4] == 2, "<" if ident[5] == 1 else ">"


def _cstr(blob, off):
    end = blob.find(b"\0", off)
    return blob[off:end if end >= 0 else len(blob)].decode("latin-1")


class ElfDynamic:
    """The dynamic symbol table of one ELF file, with GNU-hash lookups (no set of every name:
    libtorch_cpu.so exports ~75k symbols)."""

    def __init__(self, path):
        sections = elf_sections(path)
        if ".dynsym" not in sections or ".dynstr" not in sections:
            raise FatbinError("no dynamic symbol table")
        with open_regular(path) as f:
            self.is64, self.end = _elf_ident(f)

            def read(name):
                off, size = sections[name]
                if size > MAX_SYMBOL_TABLE:
                    raise FatbinError("%s of %d bytes is implausibly large" % (name, size))
                f.seek(off)
                return f.read(size)

            self.dynsym, self.dynstr = read(".dynsym"), read(".dynstr")
            self.gnu_hash = read(".gnu.hash") if ".gnu.hash" in sections else None
        self.entsize = 24 if self.is64 else 16
        self._defined = None

    def symbol(self, i):
        """(name offset, bind, section index) of symbol i."""
        if self.is64:
            name, info, _, shndx = struct.unpack_from(self.end + "IBBH", self.dynsym, i * 24)
        else:
            name, _, _, info, _, shndx = struct.unpack_from(self.end + "IIIBBH", self.dynsym, i * 16)
        return name, info >> 4, shndx

    def undefined(self):
        """Names this file needs from elsewhere (non-weak: a weak one may stay unresolved)."""
        out = []
        for i in range(1, len(self.dynsym) // self.entsize):
            name, bind, shndx = self.symbol(i)
            if shndx == 0 and bind == 1 and name:
                out.append(_cstr(self.dynstr, name))
        return out

    def defines(self, name):
        """True when this file exports `name` (a defined global or weak dynamic symbol)."""
        if self.gnu_hash is None or len(self.gnu_hash) < 16:
            if self._defined is None:
                self._defined = set(
                    _cstr(self.dynstr, n) for n, bind, shndx in
                    (self.symbol(i) for i in range(1, len(self.dynsym) // self.entsize))
                    if shndx != 0 and bind in (1, 2))
            return name in self._defined
        end, gh = self.end, self.gnu_hash
        nbuckets, symoffset, bloom_size, shift = struct.unpack_from(end + "IIII", gh, 0)
        if nbuckets == 0 or bloom_size == 0:
            return False
        h = 5381
        for c in name.encode("latin-1"):
            h = (h * 33 + c) & 0xFFFFFFFF
        bits = 64 if self.is64 else 32
        word_fmt = end + ("Q" if self.is64 else "I")
        word, = struct.unpack_from(word_fmt, gh, 16 + (bits // 8) * ((h // bits) % bloom_size))
        mask = (1 << (h % bits)) | (1 << ((h >> shift) % bits))
        if word & mask != mask:
            return False
        buckets = 16 + (bits // 8) * bloom_size
        idx, = struct.unpack_from(end + "I", gh, buckets + 4 * (h % nbuckets))
        if idx < symoffset:
            return False
        chain = buckets + 4 * nbuckets
        while chain + 4 * (idx - symoffset) + 4 <= len(gh):
            h2, = struct.unpack_from(end + "I", gh, chain + 4 * (idx - symoffset))
            if (h | 1) == (h2 | 1):
                off, _bind, shndx = self.symbol(idx)
                if shndx != 0 and _cstr(self.dynstr, off) == name:
                    return True
            if h2 & 1:
                return False
            idx += 1
        return False


def torch_symbol(name):
    """True for a mangled C++ name in torch's namespaces (_ZN3c10..., _ZNK2at..., _ZTVN5torch...)."""
    if not name.startswith("_Z"):
        return False
    s = name[2:]
    if s[:1] == "T" and s[1:2] in ("V", "I", "S"):
        s = s[2:]
    if s[:1] == "N":
        s = s[1:]
        while s[:1] in ("K", "V", "r"):
            s = s[1:]
    m = re.match(r"(\d+)", s)
    if not m:
        return False
    n = int(m.group(1))
    return s[len(m.group(1)):len(m.group(1)) + n] in _TORCH_NAMESPACES


def link_check(so_path, lib_paths):
    """Which torch symbols `so_path` needs that none of `lib_paths` exports (what `import` would
    report as "undefined symbol"). A file that is not a readable ELF gives {"error": ...}: the
    loader would refuse it too."""
    try:
        needed = [n for n in ElfDynamic(so_path).undefined() if torch_symbol(n)]
    except _MALFORMED as exc:
        return {"error": "could not read: %s: %s" % (type(exc).__name__, exc)}
    libs = []
    for p in lib_paths:
        try:
            libs.append(ElfDynamic(p))
        except _MALFORMED:
            continue
    missing = [n for n in needed if not any(lib.defines(n) for lib in libs)]
    return {"checked": len(needed), "missing": missing[:5], "missing_count": len(missing),
            "against": sorted(set(os.path.dirname(p) for p in lib_paths))}


def arch_number(text):
    """'sm_90' / 'compute_90' / '9.0' / '90' -> 90; None if not an arch."""
    if text is None:
        return None
    m = re.match(r"^(?:sm_|compute_)?(\d+)\.(\d+)$", str(text))
    if m:
        return int(m.group(1)) * 10 + int(m.group(2))
    m = re.match(r"^(?:sm_|compute_)(\d+)[af]?$", str(text)) or re.match(r"^(\d+)$", str(text))
    return int(m.group(1)) if m else None


def arch_runs_on(sass, ptx, device_cc):
    """Whether code with these SASS/PTX archs can run on a device of capability `device_cc`.

    SASS sm_XY runs on the same major with minor >= Y; PTX compute_XY JIT-compiles on any device
    >= XY (torch/cuda DEVICE_REQUIREMENT rule). Arch-specific sm_XYa / compute_XYa code runs on
    exactly X.Y; family-specific sm_XYf on the same major with minor >= Y.
    Returns (bool, how) or (None, why).
    """
    dev = arch_number(device_cc)
    if dev is None:
        return None, "device capability unknown"
    for a in sass:
        n = arch_number(a)
        if n is None:
            continue
        if str(a).endswith("a"):
            if n == dev:
                return True, "SASS %s" % a
        elif n // 10 == dev // 10 and n % 10 <= dev % 10:
            return True, "SASS %s" % a
    for a in ptx:
        n = arch_number(a)
        if n is None:
            continue
        if (n == dev) if str(a).endswith("a") else (n <= dev):
            return True, "PTX %s (JIT at load)" % a
    return False, "no SASS for sm_%d and no PTX <= compute_%d" % (dev, dev)


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _run(argv, timeout, env=None):
    """Run argv; return (rc, stdout, stderr). Raises OSError if not executable, TimeoutExpired."""
    proc = subprocess.run(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        timeout=timeout, env=env,
    )
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


DEFAULT_PROBE_TIMEOUT = 30.0


def probe_timeout(text):
    """Seconds per probe subprocess from FASTPATH_PROBE_TIMEOUT (None/empty: the default);
    ValueError for anything but a finite number > 0."""
    if text is None or not str(text).strip():
        return DEFAULT_PROBE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError("FASTPATH_PROBE_TIMEOUT=%r: expected a number of seconds > 0" % text[:40])
    return value


def _is_exe(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _which_all(name, path_value):
    """`which -a` semantics: every PATH entry holding an executable `name`, in order."""
    out = []
    for d in (path_value or "").split(os.pathsep):
        if d:
            cand = os.path.join(d, name)
            if _is_exe(cand) and cand not in out:
                out.append(cand)
    return out


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


class Options:
    """Where to look. Defaults probe the real machine; tests point these at fake trees."""

    def __init__(self, env=None, root=None, dpkg_status=None, site_packages=None, skip=None,
                 timeout=None):
        self.env = dict(os.environ if env is None else env)
        self.root = root if root is not None else self.env.get("FASTPATH_PROBE_ROOT", "/")
        self.dpkg_status = dpkg_status or self.env.get("FASTPATH_PROBE_DPKG_STATUS") or \
            self.sys_path("/var/lib/dpkg/status")
        sp = site_packages
        if sp is None and self.env.get("FASTPATH_PROBE_SITE_PACKAGES"):
            sp = [p for p in self.env["FASTPATH_PROBE_SITE_PACKAGES"].split(os.pathsep) if p]
        self.site_packages = sp if sp is not None else _default_site_packages()
        if skip is None:
            skip = [s.strip() for s in self.env.get("FASTPATH_PROBE_SKIP", "").split(",")]
        self.skip = set(s for s in skip if s)
        self.timeout_error = None
        try:
            self.timeout = timeout or probe_timeout(self.env.get("FASTPATH_PROBE_TIMEOUT"))
        except ValueError as exc:  # on a target: say so in probe.errors, probe with the default
            self.timeout, self.timeout_error = DEFAULT_PROBE_TIMEOUT, str(exc)
        self.custom_site_packages = sp is not None

    def sys_path(self, path):
        """A system path under the probe root (identity when root is /)."""
        if self.root in ("", "/"):
            return path
        return os.path.join(self.root, path.lstrip("/"))

    def describe(self):
        return {
            "root": self.root, "dpkg_status": self.dpkg_status,
            "site_packages": self.site_packages, "nvcc_site_dirs": _all_site_dirs(self),
            "skip": sorted(self.skip),
        }


def _default_site_packages():
    dirs = []
    try:
        import site
        cands = [*list(site.getsitepackages()), site.getusersitepackages()]
    except Exception:
        cands = []
    cands += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    # `pip install --target DIR` + PYTHONPATH (common on shared clusters and in containers): any
    # path entry that holds dist-info folders is a place packages are installed.
    extra = sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    cands += [p for p in extra if p and os.path.isdir(p) and glob.glob(os.path.join(p, "*.dist-info"))]
    for d in cands:
        if d and os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


# ---------------------------------------------------------------------------------------------
# individual probes (each returns its fact; an exception becomes "could not collect")
# ---------------------------------------------------------------------------------------------


def probe_host(opts):
    os_name = None
    os_release = opts.sys_path("/etc/os-release")
    try:
        with open_regular(os_release, text=True) as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        os_name = platform.system()
    glibc = None
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        lib, ver = platform.libc_ver()
        glibc = ("%s %s" % (lib, ver)).strip() or None
    return {
        "hostname": socket.gethostname(),
        "os": os_name,
        "kernel": platform.release(),
        "arch": platform.machine(),
        "glibc": glibc,
        "python": platform.python_version(),
        "executable": sys.executable,
        "source": "%s, os.confstr(CS_GNU_LIBC_VERSION), platform" % os_release,
    }


def probe_env(opts):
    out = {}
    for name in sorted(opts.env):
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES):
            value = opts.env[name]
            if any(m in name.upper() for m in SECRET_MARKERS):
                value = "<redacted>"
            out[name] = value
    return out


def probe_nvidia_smi(opts):
    """GPUs and driver from nvidia-smi; ([], None) when it is not installed."""
    exe = shutil.which("nvidia-smi", path=opts.env.get("PATH", ""))
    if exe is None:
        return [], None, "nvidia-smi not found on PATH"
    fields = "index,name,driver_version,compute_cap,memory.total"
    rc, out, err = _run([exe, "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
                        opts.timeout)
    if rc != 0:
        raise RuntimeError("nvidia-smi --query-gpu exited %d: %s" % (rc, (err or out).strip()[:200]))
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        mem = None
        try:
            mem = int(float(parts[4]))
        except ValueError:
            pass
        gpus.append({
            "index": int(parts[0]) if parts[0].isdigit() else parts[0],
            "name": parts[1], "driver": parts[2],
            "compute_capability": parts[3] if re.match(r"^\d+\.\d+$", parts[3]) else None,
            "memory_mib": mem, "source": "%s --query-gpu=%s" % (exe, fields),
        })
    driver = None
    rc, out, err = _run([exe], opts.timeout)
    m = re.search(r"CUDA Version:\s*([\d.]+)", out)
    d = re.search(r"Driver Version:\s*([\d.]+)", out)
    if m or d or gpus:
        driver = {
            "version": d.group(1) if d else (gpus[0]["driver"] if gpus else None),
            "cuda_version": m.group(1) if m else None,
            "source": "%s (header)" % exe,
        }
    return gpus, driver, None


# One guarded interpreter imports torch once and then each package in order (issue: a
# subprocess per package paid torch's import and CUDA start-up once per package: 16-22 s on an
# H200 host). The child announces each step before it starts and prints its result after, so a
# step that crashes the interpreter or hangs is known by name; the parent classifies that step's
# failure and starts a fresh interpreter for the steps after it, so one bad import never hides
# the others. The child leaves with os._exit: nothing of its teardown (CUDA, thread pools) is paid.
_IMPORTS_SCRIPT = r"""
import importlib, json, os, sys, time

def emit(tag, step, value=None, seconds=None):
    msg = {"step": step, "value": value}
    if seconds is not None:
        msg["seconds"] = round(seconds, 3)
    sys.stdout.write("%s %s\n" % (tag, json.dumps(msg)))
    sys.stdout.flush()

def why(e):
    return "%s: %s" % (type(e).__name__, e)

def do_torch():
    try:
        import torch
    except BaseException as e:
        return {"torch_error": why(e)}
    t = {"version": torch.__version__, "cuda": torch.version.cuda, "file": torch.__file__}
    t["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    t["arch_list"] = flags().split() if flags is not None and flags() else []
    try:
        t["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:
        t["cuda_available"] = False
        t["cuda_error"] = why(e)
    devs = []
    if t["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devs.append({"index": i, "name": p.name, "compute_capability": "%d.%d" % (p.major, p.minor),
                         "memory_mib": int(p.total_memory // (1024 * 1024))})
    t["devices"] = devs
    return {"torch": t}

def do_triton():
    try:
        import triton
    except BaseException as e:
        return {"triton_error": why(e)}
    tr = {"version": triton.__version__}
    try:
        from triton.runtime import driver
        target = driver.active.get_current_target()
        tr["gpu_backend"] = target.backend in ("cuda", "hip")
        tr["target"] = "%s:%s" % (target.backend, target.arch)
    except BaseException as e:
        tr["gpu_backend"] = False
        tr["backend_error"] = why(e)
    return {"triton": tr}

def do_module(name):
    try:
        m = importlib.import_module(name)
        return {"ok": True, "version": getattr(m, "__version__", None),
                "file": getattr(m, "__file__", None)}
    except BaseException as e:
        return {"ok": False, "error": why(e)}

for step in sys.argv[1:]:
    emit("FASTPATH_BEGIN", step)
    began = time.perf_counter()
    if step == "torch":
        value = do_torch()
    elif step == "triton":
        value = do_triton()
    else:
        value = do_module(step[len("module:"):])
    emit("FASTPATH_JSON", step, value, time.perf_counter() - began)
sys.stdout.flush()
os._exit(0)
"""


def _signal_name(rc):
    try:
        import signal
        return signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return "signal %d" % -rc


def _run_steps_once(steps, opts):
    """One child interpreter over `steps`. Returns ({step: value}, failed step or None, why)."""
    import selectors
    import tempfile

    done = {}
    current = None
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", _IMPORTS_SCRIPT, *steps],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                env=opts.env, start_new_session=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + opts.timeout
        timed_out = False
        try:
            while len(done) < len(steps):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    timed_out = True
                    break
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    tag, _, payload = line.decode("utf-8", "replace").partition(" ")
                    if tag not in ("FASTPATH_BEGIN", "FASTPATH_JSON"):
                        continue  # a package printing on import
                    try:
                        msg = json.loads(payload)
                    except ValueError:
                        continue
                    if tag == "FASTPATH_BEGIN":
                        current = msg["step"]
                        deadline = time.monotonic() + opts.timeout  # each step gets the timeout
                    else:
                        done[msg["step"]] = msg["value"]
                        if isinstance(msg["value"], dict) and "seconds" in msg:
                            msg["value"]["_seconds"] = msg["seconds"]
                        current = None
        finally:
            sel.close()
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    proc.kill()
            rc = proc.wait()
            proc.stdout.close()
        if len(done) == len(steps):
            return done, None, None
        failed = current or next(s for s in steps if s not in done)
        if timed_out:
            return done, failed, ("timed out after %gs" % opts.timeout, True)
        err.seek(0)
        tail = (err.read().decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        how = ("killed by %s" % _signal_name(rc)) if rc < 0 else ("exited %d" % rc)
        return done, failed, ("python %s without a result: %s" % (how, tail[:300]), False)


def run_import_steps(steps, opts):
    """Run `steps` ("torch", "triton", "module:NAME") in as few interpreters as possible: one,
    unless a step crashes or hangs it; that step gets {"failed": why, "timed_out": bool} and the
    steps after it run in a fresh interpreter. A step's own seconds are in its "_seconds"; the
    number of interpreters started is in results["_interpreters"]."""
    results = {"_interpreters": 0}
    pending = list(steps)
    while pending:
        results["_interpreters"] += 1
        done, failed, why = _run_steps_once(pending, opts)
        results.update(done)
        if failed is None:
            break
        results[failed] = {"failed": why[0], "timed_out": why[1]}
        pending = [s for s in pending[pending.index(failed) + 1:] if s not in results]
        if failed == "torch":  # packages built on torch would only crash or hang the same way
            for s in [s for s in pending if s[len("module:"):] in TORCH_MODULES]:
                results[s] = {"failed": "not attempted: import torch %s" % why[0],
                              "timed_out": False}
                pending.remove(s)
    return results


def classify_import_error(text):
    """Map an import error message to not-installed / abi-mismatch / cuda-init / other."""
    if text is None:
        return None
    if "No module named" in text or "ModuleNotFoundError" in text:
        return "not-installed"
    if "undefined symbol" in text:
        return "abi-mismatch"
    low = text.lower()
    if "cuda" in low and any(w in low for w in ("init", "driver", "no kernel image", "cudaerror",
                                                 "libcuda", "libcudart")):
        return "cuda-init"
    return "other"


def import_verdict(result):
    """The packages[dist]["import"] fact from one module step's result."""
    if result is None:
        return {"ok": False, "error_kind": "other", "error": "import not attempted"}
    if "failed" in result:
        if result.get("timed_out"):
            return {"ok": False, "error_kind": "other", "error": "import " + result["failed"]}
        return {"ok": False, "error_kind": classify_import_error(result["failed"]) or "other",
                "error": result["failed"]}
    r = dict(result)
    r.pop("_seconds", None)
    r["error_kind"] = None if r.get("ok") else classify_import_error(r.get("error"))
    r.setdefault("error", None)
    return r


def torch_triton_facts(results):
    """{"torch"|"torch_error", "triton"|"triton_error"} from the torch and triton steps."""
    out = {}
    for step in ("torch", "triton"):
        r = results.get(step)
        if r is None:
            continue
        if "failed" in r:
            out[step + "_error"] = r["failed"]
        else:
            out.update((k, v) for k, v in r.items() if k != "_seconds")
    return out


def probe_import(module, opts):
    """Import one module in a guarded interpreter (the collect() path batches them)."""
    step = "module:" + module
    return import_verdict(run_import_steps([step], opts).get(step))


class Dist:
    """What the probe needs of an installed distribution. Name and version come from the
    .dist-info folder's name (`name-version.dist-info`, as installers write it), RECORD is read only
    when asked: importlib.metadata parses every METADATA with the email parser, ~1 ms each, which
    was most of an import-free probe's time in an environment of ~140 packages."""

    def __init__(self, name, version, path, site):
        self.name, self.version, self._path, self.site = name, version, path, site

    def locate_file(self, rel):
        return os.path.join(self.site, str(rel))

    @property
    def files(self):
        try:
            with open_regular(os.path.join(self._path, "RECORD"), text=True) as fh:
                return [line.split(",", 1)[0] for line in fh if line.strip()]
        except OSError:
            return None


_INFO_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py\d[\d.]*)?\.(?:dist|egg)-info$")


def _read_headers(path):
    """Name and Version from a METADATA / PKG-INFO file's header block."""
    out = {}
    try:
        with open_regular(path, text=True) as fh:
            for line in fh:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                if key in ("Name", "Version") and key not in out:
                    out[key] = value.strip()
    except OSError:
        pass
    return out.get("Name"), out.get("Version")


def find_distributions(opts):
    """{normalized dist name: Dist} across the site-packages dirs (first one found wins)."""
    found = {}
    for site in opts.site_packages:
        try:
            entries = sorted(os.listdir(site))
        except OSError:
            continue
        for entry in entries:
            if not (entry.endswith(".dist-info") or entry.endswith(".egg-info")):
                continue
            path = os.path.join(site, entry)
            m = _INFO_RE.match(entry)
            if m:
                name, version = m.group("name"), m.group("version")
            else:  # e.g. `name.egg-info`: no version in the folder name
                meta = "PKG-INFO" if os.path.isdir(path) else None
                name, version = _read_headers(os.path.join(path, meta) if meta else path)
            if name and _norm(name) not in found:
                found[_norm(name)] = Dist(name, version, path, site)
    return found


def _dist_path(dist):
    return str(dist._path)


def compiled_files(dist):
    """Absolute paths of the compiled extension modules a dist installed (from its RECORD)."""
    out = []
    for f in dist.files or []:
        if f.endswith(".so") or ".so." in os.path.basename(f):
            out.append(os.path.normpath(dist.locate_file(f)))
    return out


def probe_so(path):
    try:
        r = read_fatbin_archs(path)
        return {"path": path, "sass": r["sass"], "ptx": r["ptx"], "sections": r["sections"]}
    except _MALFORMED as exc:
        return {"path": path, "sass": [], "ptx": [],
                "error": "could not read: %s: %s" % (type(exc).__name__, exc)}


def parse_nvcc_version(text):
    m = NVCC_RELEASE_RE.search(text or "")
    if not m:
        return None
    return {"version": m.group(3), "major": int(m.group(1)), "minor": int(m.group(2))}


def probe_nvcc_version(path, opts):
    rc, out, err = _run([path, "--version"], opts.timeout)
    v = parse_nvcc_version(out + "\n" + err)
    if v is None:
        raise RuntimeError("`%s --version` exited %d, no release line: %s"
                           % (path, rc, (err or out).strip()[:200]))
    return v


def read_dpkg_status(path):
    """CUDA compiler packages from a dpkg status file: [{name, version, status}]."""
    keep = re.compile(r"^(cuda-nvcc(-\d+-\d+)?|nvidia-cuda-toolkit|cuda-toolkit(-\d+(-\d+)?)?|"
                      r"cuda-cudart-dev-\d+-\d+|libcusparse-dev-\d+-\d+|libcublas-dev-\d+-\d+)$")
    out = []
    with open_regular(path, text=True) as f:
        stanza = {}
        for line in [*list(f), ""]:
            line = line.rstrip("\n")
            if not line.strip():
                if keep.match(stanza.get("Package", "")):
                    out.append({"name": stanza["Package"], "version": stanza.get("Version"),
                                "status": stanza.get("Status")})
                stanza = {}
            elif not line[0].isspace() and ":" in line:
                k, v = line.split(":", 1)
                stanza[k.strip()] = v.strip()
    return out


def dpkg_nvcc_paths(pkg, opts):
    """Files ending in bin/nvcc that dpkg says a package owns (its .list file), else [].

    Why: cuda-nvcc-X-Y puts nvcc under /usr/local/cuda-X.Y, nvidia-cuda-toolkit under /usr/bin;
    reading the list beats guessing.
    """
    info = os.path.join(os.path.dirname(opts.dpkg_status), "info")
    out = []
    for lst in glob.glob(os.path.join(info, pkg + ".list")) + \
            glob.glob(os.path.join(info, pkg + ":*.list")):
        try:
            with open_regular(lst, text=True) as f:
                for line in f:
                    line = line.strip()
                    if line.endswith("/bin/nvcc"):
                        out.append(line)
        except OSError:
            pass
    if not out:
        m = re.match(r"^cuda-nvcc-(\d+)-(\d+)$", pkg)
        if m:
            out.append("/usr/local/cuda-%s.%s/bin/nvcc" % (m.group(1), m.group(2)))
        elif pkg == "nvidia-cuda-toolkit":
            out.append("/usr/bin/nvcc")
    return out


def probe_rpm(opts):
    exe = shutil.which("rpm", path=opts.env.get("PATH", ""))
    if exe is None:
        return []
    rc, out, err = _run([exe, "-qa", "--qf", "%{NAME} %{VERSION}\n", "cuda-nvcc*", "cuda-toolkit*",
                         "cuda-cudart-devel*", "libcusparse-devel*"], opts.timeout)
    if rc != 0:
        raise RuntimeError("rpm -qa exited %d: %s" % (rc, err.strip()[:200]))
    return [{"name": ln.split()[0], "version": ln.split()[1] if len(ln.split()) > 1 else None}
            for ln in out.splitlines() if ln.strip()]


def probe_gcc(opts):
    exe = shutil.which("gcc", path=opts.env.get("PATH", ""))
    if exe is None:
        return None
    _rc, out, _err = _run([exe, "-dumpfullversion", "-dumpversion"], opts.timeout)
    return {"version": out.strip() or None, "path": exe, "source": "%s -dumpfullversion" % exe}


def _all_site_dirs(opts):
    """This Python's site-packages plus every other Python's on the host (system, conda, venv):
    a pip nvcc wheel may sit in any of them."""
    dirs = list(opts.site_packages)
    if opts.custom_site_packages:
        return dirs
    patterns = [opts.sys_path("/usr/lib/python3*/dist-packages"),
                opts.sys_path("/usr/local/lib/python3*/dist-packages"),
                opts.sys_path("/usr/local/lib/python3*/site-packages")]
    for var in ("CONDA_PREFIX", "VIRTUAL_ENV"):
        if opts.env.get(var):
            patterns.append(os.path.join(opts.env[var], "lib", "python3*", "site-packages"))
    for pat in patterns:
        for d in sorted(glob.glob(pat)):
            if d not in dirs:
                dirs.append(d)
    return dirs


def nvcc_candidate_sources(opts, dpkg_entries, dists, rpm_entries=()):
    """[(path, found_by, kind)] for every place an nvcc can hide (not deduplicated)."""
    env = opts.env
    out = []
    for p in _which_all("nvcc", env.get("PATH", "")):
        out.append((p, "PATH", "nvcc"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            out.append((os.path.join(env[var], "bin", "nvcc"), var, "nvcc"))
    out.append((opts.sys_path("/usr/local/cuda/bin/nvcc"), "/usr/local/cuda", "nvcc"))
    for pattern, label in (("/usr/local/cuda-*/bin/nvcc", "/usr/local/cuda-*"),
                           ("/opt/cuda*/bin/nvcc", "/opt/cuda*"),
                           ("/opt/nvidia/*/cuda/bin/nvcc", "/opt/nvidia/*"),
                           ("/usr/lib/nvidia-cuda-toolkit/bin/nvcc", "nvidia-cuda-toolkit")):
        for p in sorted(glob.glob(opts.sys_path(pattern))):
            out.append((p, label, "nvcc"))
    out.append((opts.sys_path("/usr/bin/nvcc"), "/usr/bin (Debian nvidia-cuda-toolkit)", "nvcc"))
    if env.get("CONDA_PREFIX"):
        out.append((os.path.join(env["CONDA_PREFIX"], "bin", "nvcc"), "CONDA_PREFIX", "nvcc"))
    for sp in _all_site_dirs(opts):
        out.append((os.path.join(sp, "nvidia", "cu13", "bin", "nvcc"),
                    "pip wheel nvidia-cuda-nvcc (nvidia/cu13)", "nvcc"))
        wheel_bin = os.path.join(sp, "nvidia", "cuda_nvcc", "bin")
        if _is_exe(os.path.join(wheel_bin, "nvcc")):
            out.append((os.path.join(wheel_bin, "nvcc"), "pip wheel nvidia/cuda_nvcc", "nvcc"))
        elif os.path.isfile(os.path.join(wheel_bin, "ptxas")):
            out.append((os.path.join(wheel_bin, "ptxas"),
                        "pip wheel nvidia-cuda-nvcc-cu12 (ships ptxas only)", "ptxas-only-wheel"))
    for entry in dpkg_entries:
        if entry["name"].startswith("cuda-nvcc") or entry["name"] == "nvidia-cuda-toolkit":
            for p in dpkg_nvcc_paths(entry["name"], opts):
                out.append((opts.sys_path(p), "dpkg %s %s" % (entry["name"], entry["version"]),
                            "nvcc"))
    for entry in rpm_entries:
        m = re.match(r"^cuda-nvcc-(\d+)-(\d+)$", entry["name"])
        if m:
            out.append((opts.sys_path("/usr/local/cuda-%s.%s/bin/nvcc" % m.groups()),
                        "rpm %s %s" % (entry["name"], entry.get("version")), "nvcc"))
    return out


def merge_candidates(sources):
    """Deduplicate by realpath, keeping every way each binary was found, in discovery order."""
    by_real = {}
    order = []
    for path, found_by, kind in sources:
        if kind == "nvcc" and not _is_exe(path):
            continue
        real = os.path.realpath(path)
        if real not in by_real:
            by_real[real] = {"path": path, "realpath": real, "paths": [], "found_by": [],
                             "kind": kind, "version": None, "major": None, "minor": None,
                             "major_matches_torch": None}
            order.append(real)
        c = by_real[real]
        if path not in c["paths"]:
            c["paths"].append(path)
        if found_by not in c["found_by"]:
            c["found_by"].append(found_by)
    return [by_real[r] for r in order]


def torch_cuda_home(opts):
    """Re-implementation of torch.utils.cpp_extension._find_cuda_home
    (https://github.com/pytorch/pytorch/blob/main/torch/utils/cpp_extension.py)."""
    env = opts.env
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    how = None
    if home:
        how = "CUDA_HOME env" if env.get("CUDA_HOME") else "CUDA_PATH env"
    else:
        first = _which_all("nvcc", env.get("PATH", ""))
        if first:
            home = os.path.dirname(os.path.dirname(first[0]))
            how = "dirname(dirname(which nvcc)) = %s" % first[0]
        elif os.path.exists(opts.sys_path("/usr/local/cuda")):
            home = opts.sys_path("/usr/local/cuda")
            how = "/usr/local/cuda exists"
    result = {"torch_would_use": home, "how": how or "nothing found: torch's CUDA_HOME is None",
              "has_nvcc": False, "headers": {"cuda_runtime.h": False, "cusparse.h": False},
              "include_dir": None, "cuda_home_env": env.get("CUDA_HOME"),
              "cuda_path_env": env.get("CUDA_PATH"), "diverge": False}
    if env.get("CUDA_HOME") and env.get("CUDA_PATH"):
        result["diverge"] = os.path.realpath(env["CUDA_HOME"]) != os.path.realpath(env["CUDA_PATH"])
    if home:
        result["has_nvcc"] = _is_exe(os.path.join(home, "bin", "nvcc"))
        inc = os.path.join(home, "include")
        result["include_dir"] = inc
        for h in result["headers"]:
            result["headers"][h] = os.path.isfile(os.path.join(inc, h))
    return result


def probe_nvrtc(opts, dists):
    patterns = []
    for sp in opts.site_packages:
        patterns += [os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"),
                     os.path.join(sp, "nvidia", "cu13", "lib", "libnvrtc.so*")]
    patterns += [opts.sys_path("/usr/local/cuda*/lib64/libnvrtc.so*"),
                 opts.sys_path("/usr/local/cuda*/lib/libnvrtc.so*"),
                 opts.sys_path("/usr/local/cuda*/targets/*/lib/libnvrtc.so*"),
                 opts.sys_path("/usr/lib/x86_64-linux-gnu/libnvrtc.so*")]
    if opts.env.get("CONDA_PREFIX"):
        patterns.append(os.path.join(opts.env["CONDA_PREFIX"], "lib", "libnvrtc.so*"))
    out, seen = [], set()
    for pat in patterns:
        for p in sorted(glob.glob(pat)):
            if "builtins" in os.path.basename(p) or os.path.realpath(p) in seen:
                continue
            seen.add(os.path.realpath(p))
            m = re.search(r"\.so\.([\d.]+)$", p)
            source = "file " + p
            version = m.group(1) if m else None
            for dname in ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13"):
                if "site-packages" in p and dname in dists:
                    version = dists[dname].version
                    source = "file %s; package metadata %s" % (p, dname)
                    break
            out.append({"path": p, "version": version, "source": source})
    return out


# ---------------------------------------------------------------------------------------------
# collect
# ---------------------------------------------------------------------------------------------


def _gpu_visible(opts):
    return bool(glob.glob(opts.sys_path("/dev/nvidia[0-9]*")))


# Import names of the kernel packages that import torch first (skipped after torch's own import
# crashed or hung in the guarded interpreter).
TORCH_MODULES = ("causal_conv1d", "fla", "mamba_ssm", "flash_attn")
# Read from dist-info, not imported, when the dist-info is there.
NOT_IMPORTED_WITH_DIST_INFO = ("transformers", "fastpath-kit", "speculators", "specforge")
# Kernel packages that cannot import without torch.
NEEDS_TORCH = ("causal-conv1d", "flash-linear-attention", "fla-core", "mamba-ssm", "flash-attn")
_TORCH_VERSION_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_TORCH_CUDA_RE = re.compile(r"""^cuda\s*(?::[^=\n]*)?=\s*(?:'([^']*)'|"([^"]*)"|None)""", re.M)


def torch_lib_files(dists):
    """torch's own shared libraries (what an extension's torch symbols resolve against)."""
    dist = dists.get("torch")
    if dist is None:
        return []
    return sorted(glob.glob(os.path.join(dist.locate_file("torch"), "lib", "lib*.so*")))


# torch.cuda.get_arch_list() returns a string compiled into libtorch_python.so, e.g.
# "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120" in torch 2.11.0+cu130: a NUL-terminated constant.
_ARCH_FLAGS_RE = re.compile(rb"\x00((?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)*)\x00")


def torch_arch_flags(path):
    """The archs torch was built for, from that string in .rodata; None unless exactly one."""
    found = set()
    try:
        off, size = elf_sections(path).get(".rodata", (0, 0))
        with open_regular(path) as f:  # in 4 MiB chunks (overlapping): bounded memory
            chunk, overlap, pos = 4 << 20, 4096, 0
            while pos < size:
                f.seek(off + pos)
                data = f.read(min(chunk + overlap, size - pos))
                if not data:
                    break
                found.update(m.group(1).decode("ascii") for m in _ARCH_FLAGS_RE.finditer(data))
                pos += chunk
    except _MALFORMED:
        return None
    return found.pop().split() if len(found) == 1 else None


def torch_static(dists, gpus, driver):
    """torch's facts from its files alone (the import-free probe): version.py for the version and
    CUDA, libc10.so's symbol names for the C++ ABI, libtorch_python.so's arch-flags string (else
    libtorch_cuda.so's fatbin) for the archs, nvidia-smi's GPUs and driver for cuda_available."""
    dist = dists.get("torch")
    if dist is None:
        return None
    pkg = dist.locate_file("torch")
    t = {"version": dist.version, "cuda": None, "file": os.path.join(pkg, "__init__.py"),
         "cxx11_abi": None, "arch_list": [], "devices": [],
         "source": "static: %s/version.py and torch's libraries (torch not imported)" % pkg}
    try:
        text = read_text_capped(os.path.join(pkg, "version.py"))
        m = _TORCH_CUDA_RE.search(text)
        if m:
            t["cuda"] = m.group(1) or m.group(2) or None
        v = _TORCH_VERSION_RE.search(text)  # torch.__version__: '2.11.0+cu130' where the
        if v:                               # PyPI wheel's dist-info says 2.11.0
            t["version"] = v.group(1)
    except OSError:
        t["source"] += "; no version.py"
    try:
        t["cxx11_abi"] = b"__cxx11" in ElfDynamic(os.path.join(pkg, "lib", "libc10.so")).dynstr
    except _MALFORMED:
        pass
    cuda_lib = os.path.join(pkg, "lib", "libtorch_cuda.so")
    if os.path.isfile(cuda_lib):
        flags = torch_arch_flags(os.path.join(pkg, "lib", "libtorch_python.so"))
        if flags:
            t["arch_list"] = flags
            t["arch_source"] = "libtorch_python.so: the build's arch flags string"
        else:
            try:
                r = read_fatbin_archs(cuda_lib)
                t["arch_list"] = r["sass"] + r["ptx"]
                t["arch_source"] = "libtorch_cuda.so: SASS/PTX in its fatbin"
            except _MALFORMED as exc:
                t["arch_error"] = "could not read: %s: %s" % (type(exc).__name__, exc)
    # Without importing: a CUDA build, a GPU nvidia-smi sees, a driver new enough for the build.
    if t["cuda"] is None or not gpus:
        t["cuda_available"] = False
    elif driver and driver.get("cuda_version"):
        t["cuda_available"] = int(str(driver["cuda_version"]).split(".")[0]) >= \
            int(str(t["cuda"]).split(".")[0])
    else:
        t["cuda_available"] = None
    return t


def _spec_found(module, opts):
    """A top-level module this Python would find (located, not imported)."""
    if opts.custom_site_packages:
        return False
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _module_present(dist, module):
    site = dist.site
    return (os.path.isdir(os.path.join(site, module)) or os.path.isfile(os.path.join(site, module + ".py"))
            or bool(glob.glob(os.path.join(site, module + ".*.so"))))


def static_import(dist_name, module, dists, links, opts):
    """The import verdict from files alone: dist-info, module folder, torch present, and the link
    check of every compiled .so (`links`: {so path: link_check result})."""
    dist = dists[dist_name]
    how = "static: dist-info, module files and a link check against torch's libraries; not imported"
    # (an editable install keeps its module elsewhere: ask the import system where, without importing)
    if not _module_present(dist, module) and not _spec_found(module, opts):
        return {"ok": False, "error_kind": "not-installed", "how": how,
                "error": "%s has dist-info but no %s module in %s" % (dist_name, module, dist.site)}
    if dist_name in NEEDS_TORCH and "torch" not in dists:
        return {"ok": False, "error_kind": "other", "how": how,
                "error": "%s needs torch, which is not installed" % dist_name}
    for so, r in sorted(links.items()):
        if r.get("error"):
            return {"ok": False, "error_kind": "other", "how": how, "link_check": r,
                    "error": "cannot load %s: %s" % (os.path.basename(so), r["error"])}
        if r.get("missing_count"):
            return {"ok": False, "error_kind": "abi-mismatch", "how": how, "link_check": r,
                    "error": "undefined symbol: %s (%s needs %d torch symbol%s that %s does "
                             "not export)" % (r["missing"][0], os.path.basename(so),
                                              r["missing_count"], "" if r["missing_count"] == 1
                                              else "s", ", ".join(r["against"]) or "torch")}
    out = {"ok": True, "error_kind": None, "error": None, "how": how}
    if links:
        out["link_check"] = {"so_files": len(links),
                             "torch_symbols": sum(r["checked"] for r in links.values())}
    return out


# At most this many repos, commits per repo and variants per commit are listed.
HUB_CACHE_MAX = 64


def hub_cache_dir(env):
    """(dir, how): where the `kernels` library keeps Hub kernels (kernels/_internals/hf_hub.py
    `_get_cache_dir`: KERNELS_CACHE, else huggingface_hub's HF_HUB_CACHE: HF_HUB_CACHE, else
    HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub)."""
    def expand(path):
        home = env.get("HOME") or os.path.expanduser("~")
        if path == "~" or path.startswith("~/"):
            path = home + path[1:]
        return os.path.expandvars(path)
    for name in ("KERNELS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return expand(env[name]), name
    if env.get("HF_HOME"):
        return os.path.join(expand(env["HF_HOME"]), "hub"), "HF_HOME/hub"
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    how = "XDG_CACHE_HOME/huggingface/hub" if env.get("XDG_CACHE_HOME") else \
        "~/.cache/huggingface/hub (default)"
    return os.path.join(expand(xdg), "huggingface", "hub"), how


def _read_small_json(path, limit=1 << 20):
    try:
        return json.loads(read_text_capped(path, limit))
    except (OSError, ValueError):
        return None


def probe_hub_kernel_cache(opts):
    """Which Hub kernel builds are already on disk: every `kernels--OWNER--NAME` repo in the cache
    with its refs (v3 -> commit, as `kernels` records them) and, per cached commit, the build
    variants under build/ (whether each has metadata.json, and its `backend` entry). Reads
    files only: nothing is downloaded or imported."""
    cache, how = hub_cache_dir(opts.env)
    out = {"cache_dir": cache, "how": how, "repos": {},
           "source": "directory listing of %s (%s)" % (cache, how)}
    try:
        entries = sorted(os.listdir(cache))
    except OSError:
        return out
    for entry in entries:
        if len(out["repos"]) >= HUB_CACHE_MAX:
            break
        if not entry.startswith("kernels--") or entry.count("--") < 2:
            continue
        owner, name = entry[len("kernels--"):].split("--", 1)
        repo_dir = os.path.join(cache, entry)
        repo = {"path": repo_dir, "refs": {}, "snapshots": {}}
        refs_dir = os.path.join(repo_dir, "refs")
        for ref in sorted(os.listdir(refs_dir))[:HUB_CACHE_MAX] if os.path.isdir(refs_dir) else []:
            try:
                repo["refs"][ref] = read_text_capped(os.path.join(refs_dir, ref), 256).strip()
            except OSError:
                continue
        snaps = os.path.join(repo_dir, "snapshots")
        for commit in sorted(os.listdir(snaps))[:HUB_CACHE_MAX] if os.path.isdir(snaps) else []:
            build = os.path.join(snaps, commit, "build")
            variants = {}
            for variant in sorted(os.listdir(build))[:HUB_CACHE_MAX] if os.path.isdir(build) else []:
                vdir = os.path.join(build, variant)
                if not os.path.isdir(vdir):
                    continue
                meta = os.path.join(vdir, "metadata.json")
                data = _read_small_json(meta) if os.path.isfile(meta) else None
                backend = data.get("backend") if isinstance(data, dict) else None
                variants[variant] = {"metadata": os.path.isfile(meta),
                                     "backend": backend if isinstance(backend, dict) else None}
            repo["snapshots"][commit] = variants
        out["repos"]["%s/%s" % (owner, name)] = repo
    return out


def mamba_ssm_extensions(dist, opts):
    """{"selective_scan_cuda": path | None}: the Mamba-1 CUDA scan extension of an installed
    mamba-ssm, from its RECORD, its site directory, or (this Python only) the import system,
    without importing it. state-spaces/mamba#977 made it opt-in (MAMBA_KEEP_CUDA_BUILD=TRUE)."""
    name = "selective_scan_cuda"
    for path in compiled_files(dist):
        if os.path.basename(path).startswith(name + "."):
            return {name: path}
    hits = sorted(glob.glob(os.path.join(dist.site, name + ".*.so")))
    if hits:
        return {name: hits[0]}
    if not opts.custom_site_packages:
        import importlib.util
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            return {name: spec.origin or name}
    return {name: None}


def collect(env=None, root=None, dpkg_status=None, site_packages=None, skip=None, timeout=None):
    """Gather every fact; never raises for a failed probe (it lands in probe.errors)."""
    started = time.time()
    opts = Options(env, root, dpkg_status, site_packages, skip, timeout)
    errors = {}
    facts = {"schema": SCHEMA}

    def guard(key, fn, *args):
        try:
            return fn(*args)
        except subprocess.TimeoutExpired as exc:
            errors[key] = "could not collect: timed out after %gs (%s)" % (
                exc.timeout, " ".join(str(a) for a in (exc.cmd or [])[:2]))
        except Exception as exc:
            errors[key] = "could not collect: %s: %s" % (type(exc).__name__, exc)
        return None

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=16)
    import_results = {}
    try:
        # 1. start the slow subprocesses first. The guarded imports are the critical path: one
        # interpreter imports torch (+ triton where a GPU is visible) and then each kernel package.
        run_imports = "imports" not in opts.skip
        want_triton = _gpu_visible(opts)
        smi_f = None
        if "nvidia-smi" not in opts.skip:
            smi_f = pool.submit(guard, "gpus", probe_nvidia_smi, opts)
        dists = guard("packages", find_distributions, opts) or {}
        steps = ["torch"] + (["triton"] if want_triton else [])
        seen_modules = set()
        for dist_name, module in KERNEL_DISTS:
            if not run_imports or module in seen_modules:
                continue
            if dist_name in NOT_IMPORTED_WITH_DIST_INFO and dist_name in dists:
                continue  # its version is all the plan reads: importing it cost ~1 s
            if dist_name in dists or _spec_found(module, opts):
                seen_modules.add(module)
                steps.append("module:" + module)
        imports_f = pool.submit(guard, "torch", run_import_steps, steps, opts) \
            if run_imports else None
        rpm_f = pool.submit(guard, "package_db", probe_rpm, opts) if "rpm" not in opts.skip else None
        gcc_f = pool.submit(guard, "gcc", probe_gcc, opts)

        # 2. cheap filesystem facts meanwhile
        facts["host"] = guard("host", probe_host, opts)
        facts["env"] = guard("env", probe_env, opts)
        dpkg = []
        if os.path.isfile(opts.dpkg_status):
            dpkg = guard("package_db", read_dpkg_status, opts.dpkg_status) or []
        rpm = rpm_f.result() if rpm_f is not None else None
        candidates = guard("nvcc_candidates", lambda: merge_candidates(
            nvcc_candidate_sources(opts, dpkg, dists, rpm or []))) or []
        version_f = {}
        for c in candidates:
            if c["kind"] == "nvcc":
                version_f[c["realpath"]] = pool.submit(probe_nvcc_version, c["path"], opts)
        facts["cuda_home"] = guard("cuda_home", torch_cuda_home, opts)
        facts["nvrtc"] = guard("nvrtc", probe_nvrtc, opts, dists)
        so_f, link_f = {}, {}
        torch_libs = torch_lib_files(dists) if not run_imports else []
        for dist_name, _ in KERNEL_DISTS:
            if dist_name in dists:
                for path in guard("packages", compiled_files, dists[dist_name]) or []:
                    so_f[path] = pool.submit(probe_so, path)
                    if torch_libs and dist_name in NEEDS_TORCH:
                        link_f[path] = pool.submit(guard, "packages", link_check, path, torch_libs)

        # 3. join
        for c in candidates:
            if c["kind"] == "nvcc":
                try:
                    c.update(version_f[c["realpath"]].result())
                except Exception as exc:
                    c["error"] = "could not collect: %s: %s" % (type(exc).__name__, exc)
            else:
                wheel = dists.get("nvidia-cuda-nvcc-cu12")
                c["version"] = wheel.version if wheel else None
            c["source"] = ("`%s --version`" % c["path"]) if c["kind"] == "nvcc" else \
                "file %s (no nvcc next to it)" % c["path"]
        facts["nvcc_candidates"] = candidates

        gpus, driver, smi_note = [], None, None
        if smi_f is not None:
            r = smi_f.result()
            if r is not None:
                gpus, driver, smi_note = r
        if smi_note and "gpus" not in errors:
            errors["gpus"] = "could not collect via nvidia-smi: %s" % smi_note

        import_results = (imports_f.result() or {}) if imports_f is not None else {}
        torch_info = torch_triton_facts(import_results) if imports_f is not None else None
        if not run_imports:
            torch_info = {"torch": guard("torch", torch_static, dists, gpus, driver)}
        t = (torch_info or {}).get("torch")
        torch_error = (torch_info or {}).get("torch_error") or ""
        if torch_info is not None and t is None and "No module named 'torch'" not in torch_error:
            errors["torch"] = "could not collect: %s" % torch_error
        if t is not None:
            if run_imports:
                t["source"] = "import torch in %s (subprocess)" % sys.executable
            if not gpus and t.get("devices"):
                gpus = [dict(d, driver=None, source="torch.cuda.get_device_properties")
                        for d in t["devices"]]
            cc = gpus[0]["compute_capability"] if gpus else None
            if cc and t.get("arch_list"):
                t["device_arch_covered"] = arch_runs_on(
                    [a for a in t["arch_list"] if a.startswith("sm_")],
                    [a for a in t["arch_list"] if a.startswith("compute_")], cc)[0]
            else:
                t["device_arch_covered"] = None
        facts["gpus"] = gpus
        facts["driver"] = driver
        facts["torch"] = t

        tri = (torch_info or {}).get("triton")
        if tri is not None:
            tri["source"] = "import triton; triton.runtime.driver.active (subprocess)"
        elif "triton" in dists:
            tri = {"version": dists["triton"].version, "gpu_backend": False if not want_triton
                   else None,
                   "source": "package metadata %s; gpu_backend: %s" % (
                       _dist_path(dists["triton"]),
                       "no GPU device node visible" if not want_triton
                       else (torch_info or {}).get("triton_error"))}
        if tri is not None and "triton" in dists:
            backends = os.path.join(str(dists["triton"].locate_file("triton")), "backends")
            if os.path.isdir(backends):
                tri["backends"] = sorted(d for d in os.listdir(backends)
                                         if os.path.isdir(os.path.join(backends, d))
                                         and not d.startswith("_"))
        facts["triton"] = tri

        torch_major = None
        if t and t.get("cuda"):
            torch_major = int(str(t["cuda"]).split(".")[0])
        for c in candidates:
            if c.get("major") is not None and torch_major is not None:
                c["major_matches_torch"] = c["major"] == torch_major
        if facts["cuda_home"] is not None:
            home_nvcc = os.path.join(str(facts["cuda_home"]["torch_would_use"]), "bin", "nvcc")
            for c in candidates:
                if c["realpath"] == os.path.realpath(home_nvcc):
                    facts["cuda_home"]["nvcc_version"] = c.get("version")

        facts["package_db"] = {"dpkg": dpkg, "rpm": rpm or [],
                               "source": "%s; rpm -qa" % opts.dpkg_status}
        facts["gcc"] = gcc_f.result()

        packages = {}
        clients = [(d, m) for d, m in CLIENT_DISTS if d in dists]
        for dist_name, module in KERNEL_DISTS + VERSION_ONLY_DISTS + clients:
            dist = dists.get(dist_name)
            entry = {"version": dist.version if dist else None, "module": module,
                     "source": ("package metadata " + _dist_path(dist)) if dist else
                     "no dist-info in %s" % os.pathsep.join(opts.site_packages)}
            if run_imports and "module:" + module in import_results:
                entry["import"] = import_verdict(import_results["module:" + module])
            elif run_imports and dist is not None and dist_name in NOT_IMPORTED_WITH_DIST_INFO:
                entry["import"] = {"ok": True, "error_kind": None, "error": None,
                                   "how": "dist-info present; not imported (its version is what "
                                          "the plan reads)"}
            elif not run_imports and dist is not None and dist_name not in dict(VERSION_ONLY_DISTS):
                links = {}
                for path in compiled_files(dist):
                    r = link_f[path].result() if path in link_f else None
                    if r is not None:
                        links[path] = r
                entry["import"] = static_import(dist_name, module, dists, links, opts)
            elif not run_imports and dist is not None and (dist_name != "torch" or t is not None):
                entry["import"] = {"ok": True, "error_kind": None, "error": None,
                                   "how": "static: dist-info present; not imported"}
            elif dist_name == "torch" and t is not None:
                entry["import"] = {"ok": True, "error_kind": None, "error": None}
            elif dist_name == "torch" and "torch" in errors:
                entry["import"] = {"ok": False, "error_kind": classify_import_error(
                    errors["torch"]), "error": errors["torch"]}
            elif dist_name == "triton" and (torch_info or {}).get("triton"):
                entry["import"] = {"ok": True, "error_kind": None, "error": None}
            elif dist_name == "triton" and (torch_info or {}).get("triton_error"):
                err = torch_info["triton_error"]
                entry["import"] = {"ok": False, "error_kind": classify_import_error(err),
                                   "error": err}
            elif dist is None and (run_imports or not _spec_found(module, opts)):
                entry["import"] = {"ok": False, "error_kind": "not-installed",
                                   "error": "no distribution %s and no module %s" % (
                                       dist_name, module)}
            else:
                entry["import"] = {"ok": None, "error_kind": None,
                                   "error": "import not attempted"}
            if dist_name in dict(KERNEL_DISTS) and dist is not None:
                entry["so_files"] = [so_f[p].result() for p in compiled_files(dist) if p in so_f]
            else:
                entry["so_files"] = []
            if dist_name == "mamba-ssm" and dist is not None:
                entry["extension_modules"] = guard("packages", mamba_ssm_extensions, dist, opts)
            packages[dist_name] = entry
        facts["packages"] = packages
        facts["hub_kernels"] = guard("hub_kernels", probe_hub_kernel_cache, opts)
    finally:
        pool.shutdown(wait=False)
    if opts.timeout_error:
        errors["options"] = "could not collect: %s; used %gs" % (opts.timeout_error, opts.timeout)
    facts["probe"] = {"kind": "python", "python": platform.python_version(), "errors": errors,
                      "seconds": round(time.time() - started, 3), "options": opts.describe()}
    if import_results:  # where the guarded imports spent their time (benchmarks read this)
        facts["probe"]["import_interpreters"] = import_results.get("_interpreters")
        facts["probe"]["import_seconds"] = {
            k: v.get("_seconds") for k, v in import_results.items()
            if isinstance(v, dict) and "_seconds" in v}
    return facts


# `--framed` (how fastpath.doctor.remote runs it): the JSON goes between these two lines, so a
# login banner before it or noise after it cannot be mistaken for it.
FRAME_BEGIN = "--- fastpath facts begin ---"
FRAME_END = "--- fastpath facts end ---"


def main():
    # `python3 - --static` (how `doctor --probe static` runs it on a target): no imports at all
    skip = None
    if "--static" in sys.argv[1:]:
        skip = [p for p in os.environ.get("FASTPATH_PROBE_SKIP", "").split(",") if p] + ["imports"]
    framed = "--framed" in sys.argv[1:]
    facts = collect(skip=skip)
    if framed:
        sys.stdout.write("\n" + FRAME_BEGIN + "\n")
    json.dump(facts, sys.stdout, indent=None if framed else 1, sort_keys=False, default=str)
    sys.stdout.write("\n" + (FRAME_END + "\n" if framed else ""))


if __name__ == "__main__":
    main()
