"""Pruning criteria for `jaxprune.functional` (torch.nn.utils.prune's methods)."""

from jaxprune._methods import (
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
