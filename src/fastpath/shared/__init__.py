"""The floor below every room: facts, tables and helpers that several rooms read.

- errors: the exceptions a command turns into one line and an exit status.
- extras: which optional dependency a feature needs and the `pip install` line that brings it.
- known_issues: each known-bad combination (FLA #640, ...) as a pure function of facts, read by the
  doctor's rules and by enable()'s routes alike.
- hub_kernels_env: what transformers' Hub kernels will do here (USE_HUB_KERNELS, the local cache),
  in the words the doctor and explain() both print.
- liger_families: which model families Liger Kernel patches, for the doctor and the Liger route.
- model_source: a preset, config.json or model directory read once into a value.
- output_files: where a command writes (refusing an existing or uncreatable path before work).
- plain_text, redact: output helpers (80-column text, secrets taken out of what is printed).

Imports no room (the architecture test checks it) and nothing heavy at import time.
"""
