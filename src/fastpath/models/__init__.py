"""The models every workload runs on: built from a preset, a config.json or a local checkpoint
directory (random weights or safetensors, never a download), sized before allocating, with a
reference path that stays transformers' torch fallback.

resolve (resolve_model reads the source once into a ResolvedModel; `--layers N` keeps the layer
pattern), build (build_resolved builds it: seeded random weights or the checkpoint), inputs
(verify's token ids, plain or packed), dtypes (CLI dtype and device names), sizing (parameters,
memory estimate, the refusal when it will not fit), compare (tolerances and tensor statistics
that verify and capture's re-check share), forward (one pass of a model on the active path, and
the fp32 / rounding-noise runs of the reference), greedy (cached greedy decoding, step by step),
moe_pin (an MoE's top-k choices pinned to the reference's), sides (verify's two sides: each a pass,
a decode under the pins and the kernel calls it made), judge (verify's two runs compared in one
call, consulting the reference's runs only where a difference is beyond the limit), paths
(compiled peers hidden for the reference).
May import: kernels, routing, shared. Imported by proof and capture.
Entry points: resolve.resolve_model, build.build_resolved.
"""
