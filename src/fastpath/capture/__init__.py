"""`fastpath capture MODEL DATA --out DIR`: a target's hidden states for EAGLE-3 drafter training,
captured on the fast path with every written row checked (engine-side dumps have shipped all-zero
or un-captured states: vLLM PR #46301, speculators #613, vLLM PR #36527).

run.py drives a capture: options (what it takes, the checks before anything is read) ->
out_dir (--out, the settings a resume must match) -> target (MODEL resolved once, DATA's rows via
data: JSONL -> token rows, chat rendering, loss masks; the weights; the fast-path gate) -> loop
(packing: length-sorted batches -> layers: which states, hooks, norm convention -> forward ->
checks on the device -> recheck: sampled rows on the reference path -> staging: background
copies -> writers: atomic files) -> finish (the index, capture_summary.json, client checks). formats holds one class per offline layout (FORMATS); clients and client_check run a
client's own code for --check-client; distributed (torchrun, FSDP2), interrupts (Ctrl-C).
May import: kernels, routing, models, shared; never proof.
Entry points: capture_cli.add_arguments / capture_cli.main (`fastpath capture`), run.run_capture.
"""
