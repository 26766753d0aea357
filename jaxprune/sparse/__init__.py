"""Sparse training from scratch: static masks, SET, RigL and the straight-through estimator.

See docs/guides/sparse.md.
"""

from jaxprune._attributes import suggesting_getattr
from jaxprune.sparse._distributions import densities, erk_densities, kept_count, sparse_names
from jaxprune.sparse._rules import rigl, set_, static
from jaxprune.sparse._select import drop_and_grow, random_mask, top_k_mask
from jaxprune.sparse._ste import STEState, ste
from jaxprune.sparse._summaries import apply_masks, find_state, get_masks
from jaxprune.sparse._training import SparseState, drop_fraction_at, reset_at, sparse_training

__all__ = [
  'STEState',
  'SparseState',
  'apply_masks',
  'densities',
  'drop_and_grow',
  'drop_fraction_at',
  'erk_densities',
  'find_state',
  'get_masks',
  'kept_count',
  'random_mask',
  'reset_at',
  'rigl',
  'set_',
  'sparse_names',
  'sparse_training',
  'static',
  'ste',
  'top_k_mask',
]

# A misspelt name suggests the nearest public one (`sparse.set` -> `sparse.set_`).
__getattr__ = suggesting_getattr(__name__, __all__)
