"""Proof on the user's model: `fastpath verify` (the reference and the fast path compute the same
function, and the fast path really ran fast kernels), `fastpath bench` (what it bought, next to
the peers, each configuration in its own process) and `fastpath warmup` (compile and autotune once).

verify_cli / verify / run_paths / verdict (the command line, its rendering, running both paths,
the verdict), bench_cli / bench / bench_spec / bench_worker / bench_outputs (the command line,
running the workers, its phases and configurations, the worker process, its JSON / markdown /
PNG), warmup_cli / warmup (the command line, the compiling and its cache), decode_graphs (the
CUDA-graph decode phase), progress.
May import: kernels, routing, models, shared. Never imported by capture.
Entry points: verify_cli.main, bench_cli.main, warmup_cli.main (through cli.py);
run_paths.verify_model.
"""
