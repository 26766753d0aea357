"""Structured pruning: find the channels of any JAX model that are removed together,
choose which go, and cut them out (docs/explanation/structured_design.md)."""

from jaxprune._attributes import suggesting_getattr
from jaxprune.structured._core.graph import (
  KINDS,
  AxisPart,
  ChannelGroup,
  DependencyGraph,
  Member,
  VarKey,
)
from jaxprune.structured._core.plan import Constraint, Plan, make_plan, plan_for
from jaxprune.structured._primitives.cost import plan_flops
from jaxprune.structured._primitives.rules import elementwise
from jaxprune.structured._primitives.table import (
  Primitive,
  primitive_table,
  register_primitive,
  register_rule,
  register_shrink_rule,
)
from jaxprune.structured._prune.distance import DenseDistance
from jaxprune.structured._prune.options import Calibration, LinenOptions
from jaxprune.structured._prune.pipeline import prune
from jaxprune.structured._prune.result import PruneResult
from jaxprune.structured._select.activations import activation_importance
from jaxprune.structured._select.importance import (
  bn_scale_importance,
  density_importance,
  magnitude_importance,
  random_importance,
  score_channels,
  taylor_importance,
)
from jaxprune.structured._select.selectors import by_cost, global_, select, uniform
from jaxprune.structured._shrink.apply import (
  apply_plan,
  pruned_callable,
  shrink_variables,
  zero_removed,
)
from jaxprune.structured._shrink.calibrate import linen_update_fn, recalibrate, recalibrate_nnx
from jaxprune.structured._shrink.flax_rebuild import (
  check_linen_shapes,
  linen_feature_sizes,
  linen_resized,
  update_nnx,
  update_nnx_attributes,
)
from jaxprune.structured._shrink.verify import (
  APPROXIMATE_RTOL,
  VerifyReport,
  dense_reference,
  verify,
)
from jaxprune.structured._trace.tracing import retrace, trace

__all__ = [
  'APPROXIMATE_RTOL',
  'AxisPart',
  'Calibration',
  'ChannelGroup',
  'Constraint',
  'DenseDistance',
  'DependencyGraph',
  'KINDS',
  'LinenOptions',
  'Member',
  'Plan',
  'Primitive',
  'PruneResult',
  'VarKey',
  'VerifyReport',
  'activation_importance',
  'apply_plan',
  'bn_scale_importance',
  'by_cost',
  'check_linen_shapes',
  'dense_reference',
  'density_importance',
  'elementwise',
  'global_',
  'linen_feature_sizes',
  'linen_resized',
  'linen_update_fn',
  'magnitude_importance',
  'make_plan',
  'plan_flops',
  'plan_for',
  'primitive_table',
  'prune',
  'pruned_callable',
  'random_importance',
  'recalibrate',
  'recalibrate_nnx',
  'register_primitive',
  'register_rule',
  'register_shrink_rule',
  'retrace',
  'score_channels',
  'select',
  'shrink_variables',
  'taylor_importance',
  'trace',
  'uniform',
  'update_nnx',
  'update_nnx_attributes',
  'verify',
  'zero_removed',
]

# A misspelt name suggests the nearest public one (`sparse.set` -> `sparse.set_`).
__getattr__ = suggesting_getattr(__name__, __all__)
