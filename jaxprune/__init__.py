"""jaxprune: gradual magnitude pruning and structured channel pruning for JAX.

The public API (docs/api/index.md lists every name):
  * the core engine (TF model_pruning semantics): get_pruning_hparams, parse_hparams,
    sparsity_at, update_mask, pruning, PruningState and the accessors;
  * N:M masks, export (strip, BCOO, size report), sharding helpers;
  * namespaces loaded on first use, so that `import jaxprune` needs only jax, optax, numpy
    and ml_collections: jaxprune.functional and jaxprune.methods (torch.nn.utils.prune
    counterpart), jaxprune.sparse (sparse training from scratch), jaxprune.structured
    (structured channel pruning; needs flax and scipy), jaxprune.channels (gradual channel
    pruning).

The main job, `jaxprune-train`, is its own package beside this one (`jaxprune_train`):
`import jaxprune` imports nothing of it.
"""

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

from jaxprune._attributes import no_attribute
from jaxprune._config.hparams import HParams, get_pruning_hparams, parse_hparams
from jaxprune._config.maps import parse_nm
from jaxprune._config.schedule import sparsity_at
from jaxprune._masks.nm import is_nm_sparse, nm_mask
from jaxprune._masks.update import update_mask
from jaxprune._names import leaf_name, named_leaves, tree_names
from jaxprune._results.export import (
  OutputMismatchError,
  check_sparse_outputs,
  sparse_apply,
  strip,
  to_bcoo,
)
from jaxprune._results.sharding import (
  abstract_with_shardings,
  pruning_state_shardings,
  state_shardings,
)
from jaxprune._results.sizes import SizeReport, size_report
from jaxprune._results.summaries import (
  apply_masks,
  count_nonfinite,
  find_pruning_state,
  get_masks,
  get_thresholds,
  get_weight_sparsity,
  summaries,
)
from jaxprune._search.counting import WeightReader
from jaxprune._transform.transform import MaskRule, PruningState, pruned, pruning

if TYPE_CHECKING:
  from jaxprune import channels, functional, methods, oneshot, sparse, structured

# Namespaces, as in optax (`optax.contrib`), are attributes of the package rather than
# entries of `__all__`: `from jaxprune import *` then stays as light as `import jaxprune`.
_NAMESPACES = ('channels', 'functional', 'methods', 'oneshot', 'sparse', 'structured')

try:
  __version__ = importlib.metadata.version('jaxprune')  # pyproject.toml's, once installed
except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
  __version__ = '0+unknown'

__all__ = [
  'HParams',
  'MaskRule',
  'OutputMismatchError',
  'PruningState',
  'SizeReport',
  'WeightReader',
  'abstract_with_shardings',
  'apply_masks',
  'check_sparse_outputs',
  'count_nonfinite',
  'find_pruning_state',
  'get_masks',
  'get_pruning_hparams',
  'get_thresholds',
  'get_weight_sparsity',
  'is_nm_sparse',
  'leaf_name',
  'named_leaves',
  'nm_mask',
  'parse_hparams',
  'parse_nm',
  'pruned',
  'pruning',
  'pruning_state_shardings',
  'size_report',
  'sparse_apply',
  'sparsity_at',
  'state_shardings',
  'strip',
  'summaries',
  'to_bcoo',
  'tree_names',
  'update_mask',
]


def __getattr__(name: str) -> Any:
  """Imports a namespace on first use (PEP 562): `jaxprune.structured.trace(...)`."""
  if name in _NAMESPACES:
    return importlib.import_module(f'{__name__}.{name}')
  if name == 'train':
    raise AttributeError(
      "module 'jaxprune' has no attribute 'train': the main job is the package "
      '`jaxprune_train` beside it (`import jaxprune_train`, or run `jaxprune-train`)'
    )
  raise no_attribute(__name__, name, [*__all__, *_NAMESPACES])


def __dir__() -> list[str]:
  return sorted({*globals(), *_NAMESPACES})
