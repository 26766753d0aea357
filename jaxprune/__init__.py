"""jaxprune: gradual magnitude pruning and structured channel pruning for JAX.

The public API (see README.md):
  * the core engine (TF model_pruning semantics): get_pruning_hparams, parse_hparams,
    sparsity_at, update_mask, pruning, PruningState and the accessors;
  * functional pruning (torch.nn.utils.prune counterpart): jaxprune.functional, jaxprune.methods;
  * N:M masks, export (strip, BCOO, size report), sharding helpers;
  * structured channel pruning: jaxprune.structured.
"""

from jaxprune import channels, functional, methods, structured
from jaxprune.export import check_sparse_outputs, size_report, sparse_apply, strip, to_bcoo
from jaxprune.hparams import get_pruning_hparams, parse_hparams
from jaxprune.masks import update_mask
from jaxprune.names import leaf_name, named_leaves, tree_names
from jaxprune.nm import is_nm_sparse, nm_mask, parse_nm
from jaxprune.schedule import sparsity_at
from jaxprune.sharding import abstract_with_shardings, pruning_state_shardings, state_shardings
from jaxprune.summaries import (
    apply_masks,
    count_nonfinite,
    find_pruning_state,
    get_masks,
    get_thresholds,
    get_weight_sparsity,
    summaries,
)
from jaxprune.transform import PruningState, pruned, pruning
