"""jaxprune: gradual magnitude pruning and structured channel pruning for JAX."""

from jaxprune.names import leaf_name, named_leaves, tree_names

# -- core engine (SPEC.md) --
from jaxprune.hparams import get_pruning_hparams, parse_hparams
from jaxprune.masks import update_mask
from jaxprune.schedule import sparsity_at
from jaxprune.summaries import (
    apply_masks,
    count_nonfinite,
    find_pruning_state,
    get_masks,
    get_thresholds,
    get_weight_sparsity,
    summaries,
)
from jaxprune.transform import PruningState, pruning

# -- additions from other modules (one import line each) --
