"""Integrations that route other libraries (transformers) to fastpath's kernels.

The routes enable() installs are one declared table, ``ROUTES`` in routing/routes.py: a frozen
``Route`` per route (name, ops, detect, install / enter / leave, seed, patch, patch_built,
after_undo, explain rows) that enable(), disable(), suspended(), explain(), assert_fast() and
EnableReport loop over. Adding a route is one table entry plus its module (routing/<name>_route.py:
its detection, the patch of one modeling module, its explain() rows).
"""
