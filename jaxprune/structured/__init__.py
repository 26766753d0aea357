"""Structured pruning: find the channels of any JAX model that are removed together,
choose which go, and cut them out (DESIGN.md, "Structured pass")."""

from jaxprune.structured.activations import activation_importance
from jaxprune.structured.api import PruneResult, prune
from jaxprune.structured.calibrate import linen_update_fn, recalibrate, recalibrate_nnx
from jaxprune.structured.cost import plan_flops
from jaxprune.structured.flax_rebuild import (
    check_linen_shapes,
    linen_feature_sizes,
    linen_resized,
    update_nnx,
    update_nnx_attributes,
)
from jaxprune.structured.groups import AxisPart, ChannelGroup, DependencyGraph, Member, VarKey
from jaxprune.structured.importance import (
    bn_scale_importance,
    density_importance,
    magnitude_importance,
    random_importance,
    score_channels,
    taylor_importance,
)
from jaxprune.structured.kinds import KINDS
from jaxprune.structured.oracle import APPROXIMATE_RTOL, VerifyReport, dense_reference, verify
from jaxprune.structured.plan import Constraint, Plan, make_plan, plan_for
from jaxprune.structured.primitives import (
    register_primitive,
    register_rule,
    register_shrink_rule,
)
from jaxprune.structured.rules import elementwise
from jaxprune.structured.selectors import by_cost, global_, select, uniform
from jaxprune.structured.shrink import apply_plan, pruned_callable, shrink_variables, zero_removed
from jaxprune.structured.trace import retrace, trace

__all__ = [
    'APPROXIMATE_RTOL', 'AxisPart', 'ChannelGroup', 'Constraint', 'DependencyGraph', 'KINDS',
    'Member', 'Plan', 'PruneResult', 'VarKey', 'VerifyReport', 'activation_importance',
    'apply_plan', 'bn_scale_importance', 'by_cost', 'check_linen_shapes', 'dense_reference',
    'density_importance', 'elementwise', 'global_', 'linen_feature_sizes', 'linen_resized',
    'linen_update_fn', 'magnitude_importance', 'make_plan', 'plan_flops', 'plan_for', 'prune',
    'pruned_callable', 'random_importance', 'recalibrate', 'recalibrate_nnx', 'register_primitive',
    'register_rule', 'register_shrink_rule', 'retrace', 'score_channels', 'select',
    'shrink_variables', 'taylor_importance', 'trace', 'uniform', 'update_nnx',
    'update_nnx_attributes', 'verify', 'zero_removed',
]
