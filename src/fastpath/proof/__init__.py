"""Proof on the user's model: `fastpath verify` (the reference path and the fast path compute the
same function, and the fast path really ran Triton kernels) and `fastpath bench` (what it bought,
side by side with the peers, each configuration in its own process).

Modules: verify / run_paths / verdict (the verify command, running both paths, the verdict), bench /
bench_spec / bench_worker / bench_outputs (the bench command, its phases and configurations, the
worker process, its JSON/markdown/PNG), decode_graphs and greedy (decode phases), progress.
May import: kernels, routing, models. Never imported by capture.
"""
