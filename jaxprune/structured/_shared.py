"""What other jaxprune packages may use of structured beyond its public names.

`jaxprune.channels` (gradual channel pruning ends in a structured plan), the
main job's channel report (`jaxprune.train`), one-shot pruning's calibration
pass (`jaxprune.oneshot`) and the benchmarks import these
names from here and from nowhere else inside structured; the rest of
structured's private modules may change without notice.

  is_weight        whether a variables leaf counts for weight-based importance
                   (not a running statistic such as BatchNorm's mean and var)
  traced_outputs   the traced function run as traced, outputs tied to
                   variables cut to a plan's kept positions
  compare          two output pytrees leaf by leaf, as `verify` does
  checked_callable  what a check runs for a pruned callable: the same replay
                   at full float32 precision where the backend rounds products
  flops_kept       the FLOPs convention of every result: after / before
  flops_text       that fraction as '29.2% kept, 3.42x fewer'
  FlopsReport      the FLOPs part of a result with `flops_before` and
                   `flops_after`: its `flops_kept` and its FLOPs line
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

from jaxprune.structured._core.cost import FlopsReport, count_flops, flops_kept, flops_text
from jaxprune.structured._core.jaxprs import call_body
from jaxprune.structured._core.params import scan as scan_layout
from jaxprune.structured._core.products import conv_axes, dot_axes
from jaxprune.structured._select.importance import is_weight
from jaxprune.structured._shrink.verify import checked_callable, compare, traced_outputs
from jaxprune.structured._trace.kinds import activation_products

__all__ = [
  'FlopsReport',
  'activation_products',
  'call_body',
  'checked_callable',
  'compare',
  'conv_axes',
  'count_flops',
  'dot_axes',
  'flops_kept',
  'flops_text',
  'is_weight',
  'scan_layout',
  'traced_outputs',
]
