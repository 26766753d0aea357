"""The functional API (torch.nn.utils.prune counterpart): prune a params tree, not a module."""

from jaxprune._functional import (
  global_unstructured,
  l1_unstructured,
  ln_structured,
  nm_structured,
  prune,
  random_unstructured,
  remove,
)

__all__ = [
  'global_unstructured',
  'l1_unstructured',
  'ln_structured',
  'nm_structured',
  'prune',
  'random_unstructured',
  'remove',
]
