"""The models every workload runs on: build one from a preset, a config.json or a local checkpoint
directory (random weights or safetensors, never a download), size it before allocating, and keep
the reference path honest.

Modules: build (source -> ResolvedModel, read once -> model, `--layers N` keeping the layer
pattern), dtypes (CLI dtype/device names), sizing (parameters, memory estimate, the refusal when
it will not fit), compare (tolerances and tensor statistics that verify and capture's re-check
share), paths (the torch reference with compiled peers hidden).
May import: kernels, routing. Imported by: proof, capture.
"""
