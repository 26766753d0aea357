"""Structured pruning: find the channels of any JAX model that are removed together."""

from jaxprune.structured.groups import AxisPart, ChannelGroup, DependencyGraph, Member, VarKey
from jaxprune.structured.rules import elementwise, register_rule
from jaxprune.structured.trace import trace

__all__ = [
    'AxisPart', 'ChannelGroup', 'DependencyGraph', 'Member', 'VarKey', 'elementwise',
    'register_rule', 'trace',
]

# -- select / shrink (issue 5) --
from jaxprune.structured.api import PruneResult, prune  # noqa: E402
from jaxprune.structured.calibrate import linen_update_fn, recalibrate, recalibrate_nnx  # noqa: E402
from jaxprune.structured.cost import plan_flops  # noqa: E402
from jaxprune.structured.flax_rebuild import (  # noqa: E402
    check_linen_shapes,
    linen_feature_sizes,
    linen_resized,
    update_nnx,
    update_nnx_attributes,
)
from jaxprune.structured.importance import (  # noqa: E402
    bn_scale_importance,
    density_importance,
    magnitude_importance,
    random_importance,
    score_channels,
    taylor_importance,
)
from jaxprune.structured.interpret import register_shrink_rule  # noqa: E402
from jaxprune.structured.oracle import VerifyReport, dense_reference, verify  # noqa: E402
from jaxprune.structured.plan import Constraint, Plan, make_plan  # noqa: E402
from jaxprune.structured.selectors import by_cost, global_, select, uniform  # noqa: E402
from jaxprune.structured.shrink import (  # noqa: E402
    apply_plan,
    pruned_callable,
    shrink_variables,
    zero_removed,
)

__all__ += [  # noqa: PLE0605
    'Constraint', 'Plan', 'PruneResult', 'VerifyReport', 'apply_plan', 'bn_scale_importance',
    'by_cost', 'check_linen_shapes', 'dense_reference', 'density_importance', 'global_',
    'linen_feature_sizes', 'linen_resized', 'linen_update_fn',
    'magnitude_importance', 'make_plan', 'plan_flops', 'prune', 'pruned_callable',
    'random_importance', 'recalibrate', 'recalibrate_nnx', 'register_shrink_rule',
    'score_channels', 'select',
    'shrink_variables', 'taylor_importance', 'uniform', 'update_nnx', 'update_nnx_attributes',
    'verify', 'zero_removed',
]
