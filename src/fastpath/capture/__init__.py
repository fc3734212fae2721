"""`fastpath capture MODEL DATA --out DIR`: dump a target's hidden states for EAGLE-3 drafter
training, on the fast path, with every written row checked.

Why here: drafter training runs the target over hundreds of thousands of sequences; a hybrid
target on transformers' torch fallback makes that the bottleneck, and engine-side dumps have
shipped all-zero or un-captured states (vLLM PR #46301, speculators #613, vLLM PR #36527). This
package runs the transformers target with `fastpath.enable()`, refuses a fallback unless told,
checks every tensor it writes, re-runs sampled rows on the reference path, and writes the offline
layouts that speculators and SpecForge read.

Modules: data (JSONL -> token rows, chat rendering, loss masks), packing (length-sorted batches),
layers (which states, hooks, norm convention), formats (one class per layout: its name, dtype
rule, writer, client and notes), writers (one per layout, atomic files),
staging (device->host copies and background writes that overlap the next batch),
checks (tensor and file checks, batched on the device), recheck (reference re-run),
distributed (torchrun split; replicated or FSDP2-sharded target), run (the loop), cli.
"""
