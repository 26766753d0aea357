"""What other jaxprune packages may use of structured beyond its public names.

`jaxprune.channels` (gradual channel pruning ends in a structured plan),
one-shot pruning's calibration pass (`jaxprune.oneshot`) and the benchmarks
import these names from here and from nowhere else inside structured; the
rest of structured's private modules may change without notice. (The FLOPs
convention of every result, `flops_kept`, is the core's: `jaxprune/_results/flops.py`.)

  is_weight        whether a variables leaf counts for weight-based importance
                   (not a running statistic such as BatchNorm's mean and var)
  traced_outputs   the traced function run as traced, outputs tied to
                   variables cut to a plan's kept positions
  compare          two output pytrees leaf by leaf, as `verify` does
  dense_distance   how far a pruned model's outputs are from the dense model's
                   (`DenseDistance`: relative output error, top-1 agreement)
  has_batch_norm   whether variables hold BatchNorm statistics (the advice names
                   their re-calibration only then)
  checked_callable  what a check runs for a pruned callable: the same replay
                   at full float32 precision where the backend rounds products
  count_flops      the one FLOPs counter (`plan_flops`), leaving out the
                   equations a predicate picks
  activation_products  that predicate for attention's products of two
                   activations, which counters that see only layers leave out
  call_body        the body of a call equation (pjit, custom_jvp, ...), as the
                   one traversal of jaxprs finds it
  dot_axes         a `dot_general`'s contracting and batch axes, per operand
  conv_axes        a convolution's batch, feature and spatial axes, named
  scan_layout      a `scan` equation's consts, carries, xs, ys, body, length and
                   direction, from either JAX's parameters (`_core/params.py`)
"""

from jaxprune.structured._core.params import scan as scan_layout
from jaxprune.structured._core.products import conv_axes, dot_axes
from jaxprune.structured._primitives.cost import count_flops
from jaxprune.structured._primitives.traversal import call_body
from jaxprune.structured._prune.distance import distance as dense_distance
from jaxprune.structured._prune.distance import has_batch_norm
from jaxprune.structured._select.importance import is_weight
from jaxprune.structured._shrink.verify import (
  checked_callable,
  compare,
  computation_rtol,
  traced_outputs,
)
from jaxprune.structured._trace.kinds import activation_products

__all__ = [
  'activation_products',
  'call_body',
  'checked_callable',
  'compare',
  'computation_rtol',
  'conv_axes',
  'count_flops',
  'dense_distance',
  'has_batch_norm',
  'dot_axes',
  'is_weight',
  'scan_layout',
  'traced_outputs',
]
