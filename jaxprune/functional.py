"""The functional API (torch.nn.utils.prune counterpart): prune a params tree, not a module."""

from jaxprune._attributes import suggesting_getattr
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

# A misspelt name suggests the nearest public one (`sparse.set` -> `sparse.set_`).
__getattr__ = suggesting_getattr(__name__, __all__)
