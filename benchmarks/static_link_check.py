"""The static probe's link check and arch read on real artifacts (a one-off check, not CI: it
needs a CUDA torch wheel's files and a compiled extension).

For each torch tree given, report what `doctor --probe static` derives from the files alone
(version, CUDA, C++ ABI, arch list) and whether the extension's torch symbols resolve there.

    python benchmarks/static_link_check.py --ext EXT.so --torch-site SITE [--torch-site SITE2 ...]
        [--out benchmarks/results/static_link_check.json]

SITE is a site-packages folder (or an unpacked wheel) holding torch/ and torch-*.dist-info.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fastpath.doctor import probe


def check(ext: str, site: str) -> dict:
    dists = probe.find_distributions(probe.Options(site_packages=[site]))
    if "torch" not in dists:
        return {"site": site, "error": "no torch dist-info there"}
    started = time.perf_counter()
    facts = probe.torch_static(dists, [], None)
    link = probe.link_check(ext, probe.torch_lib_files(dists))
    return {"site": site, "torch": {k: facts.get(k) for k in
                                    ("version", "cuda", "cxx11_abi", "arch_list", "arch_source")},
            "link_check": link, "seconds": round(time.perf_counter() - started, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ext", required=True, help="a compiled torch extension (.so)")
    ap.add_argument("--torch-site", action="append", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [check(args.ext, site) for site in args.torch_site]
    record = {"ext": args.ext, "ext_archs": probe.read_fatbin_archs(args.ext), "results": rows,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
