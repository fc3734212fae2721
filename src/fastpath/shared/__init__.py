"""The bottom floor: facts, tables and helpers that several rooms read.

errors (exceptions a command turns into one line and an exit status), extras (which optional
dependency a feature needs, and its `pip install` line), known_issues (each known-bad combination,
e.g. FLA #640, as a pure function of facts, asked by the doctor's rules and enable()'s routes
alike), hub_kernels_env (what transformers' Hub kernels will do here), liger_families (the
families Liger Kernel patches), model_source (a preset, config.json or model directory read once
into a value), output_files (where a command writes, refused before work when unusable),
plain_text and redact (printed text made inert and free of secrets).
May import: no room, and nothing heavy at import time (tests/test_architecture.py checks it).
Entry points: the modules themselves; ARCHITECTURE.md shows who reads which.
"""
