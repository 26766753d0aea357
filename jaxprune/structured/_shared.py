"""What other jaxprune packages may use of structured beyond its public names.

`jaxprune.channels` (gradual channel pruning ends in a structured plan), the
main job's channel report (`jaxprune.train`) and the benchmarks import these
names from here and from nowhere else inside structured; the rest of
structured's private modules may change without notice.

  is_weight        whether a variables leaf counts for weight-based importance
                   (not a running statistic such as BatchNorm's mean and var)
  traced_outputs   the traced function run as traced, outputs tied to
                   variables cut to a plan's kept positions
  compare          two output pytrees leaf by leaf, as `verify` does
  flops_kept       the FLOPs convention of every result: after / before
  flops_text       that fraction as '29.2% kept, 3.42x fewer'
"""

from jaxprune.structured._core.cost import flops_kept, flops_text
from jaxprune.structured._select.importance import is_weight
from jaxprune.structured._shrink.verify import compare, traced_outputs

__all__ = ['compare', 'flops_kept', 'flops_text', 'is_weight', 'traced_outputs']
