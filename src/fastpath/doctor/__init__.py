"""`fastpath doctor`: why a model would take the slow path, here, on another host or over a fleet.

probe.py (standard library only, sent to any host as `python3 - < probe.py`; probe.sh for hosts
without Python) gathers facts -> facts (one read-only view of them, --gpu assumptions included)
-> rules (known-bad combinations as data) + plan / families / hub_kernels (which implementation
each op of each layer gets) -> diagnosis (decide_verdict: the one verdict and exit status) ->
report, or --json. remote runs the probe through an argv prefix (or under another local
interpreter), fleet and inventory over many targets; facts_check validates what arrives,
gpu_models reads --gpu.
May import: shared only (it runs on login nodes and image builders without torch).
Entry point: doctor_cli.add_arguments / doctor_cli.main, reached through `fastpath doctor`.
"""
