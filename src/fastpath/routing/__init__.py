"""The only room that reaches into other libraries: routes transformers (and its Hub kernels, FLA,
Liger Kernel) to fastpath's kernels, and undoes it exactly.

engine.py holds enable() / disable() / suspended() / explain() / assert_fast(); they loop over
ROUTES in routes.py, one frozen Route per route (detect, enter / leave, report, install, seed,
patch, patch_built, after_undo, explain rows). Route code sits in per-route modules (conv_route,
ssd_route, selective_scan_route, fla_route, norm_route, gates_route, zc_norm_route, add_norm_route,
swiglu_route, embedding_route, lm_head_route, hub_kernels, autotune_decisions); hub_wrappers reads transformers'
kernel wrappers (for explain and the routes), mamba_common holds what the two Mamba routes share,
route_modes what the class-forward routes share (mode switch, fused-kernel detection, explain row),
modeling_patch finds and hooks modeling modules, patch_registry is the undo log; run_cli.py,
launcher.py and _bootstrap/ make `fastpath run`.
May import: causal_conv1d, kernels, shared.
Entry points: engine (behind the package root's enable/disable/explain/assert_fast), run_cli.main.
"""
