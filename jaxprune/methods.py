"""Pruning criteria for `jaxprune.functional` (torch.nn.utils.prune's methods)."""

from jaxprune._attributes import suggesting_getattr
from jaxprune._masks.methods import (
  L1Unstructured,
  LnStructured,
  NMStructured,
  PruningMethod,
  RandomUnstructured,
  prune_lowest,
  validate_amount,
)

__all__ = [
  'L1Unstructured',
  'LnStructured',
  'NMStructured',
  'PruningMethod',
  'RandomUnstructured',
  'prune_lowest',
  'validate_amount',
]

# A misspelt name suggests the nearest public one (`sparse.set` -> `sparse.set_`).
__getattr__ = suggesting_getattr(__name__, __all__)
