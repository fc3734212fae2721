"""Whether transformers' Hub kernels are on: decided here once, for the doctor and for enable().

transformers reads USE_HUB_KERNELS (unset means YES): Hub kernels are on when the value, upper-
cased, is one of 1/ON/YES/TRUE (src/transformers/integrations/hub_kernels.py at v5.14.0-v5.24:
`ENV_VARS_TRUE_VALUES`); 5.25 reads it with `is_env_variable_true`, which also takes "y"
(src/transformers/utils/import_utils.py at v5.25.0). Any other value turns them off.

fastpath.enable() sets USE_HUB_KERNELS=0 when the user has not set it (so from_pretrained stays
offline and on fastpath's routes) and keeps a value the user set. The doctor's plan asks
`on_after_enable` what enable() will leave, and routing/hub_kernels.py asks `value_after_enable`
what to set: the report and the routing cannot disagree (issue #24).
"""

from __future__ import annotations

ENV = "USE_HUB_KERNELS"
# What enable() sets when the variable is unset.
OFF_VALUE = "0"
_TRUE = frozenset(("1", "on", "yes", "true", "y"))


def on(value: str | None) -> bool:
    """Hub kernels are on for this USE_HUB_KERNELS value (None: unset, which means on)."""
    return value is None or value.lower() in _TRUE


def value_after_enable(value: str | None) -> str:
    """USE_HUB_KERNELS as fastpath.enable() leaves it: OFF_VALUE when unset, else the user's."""
    return OFF_VALUE if value is None else value


def on_after_enable(value: str | None) -> bool:
    """Hub kernels stay on after fastpath.enable() only where the user set a true value."""
    return on(value_after_enable(value))
