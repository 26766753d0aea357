"""Shapes of jaxpr variables, which may hold symbolic dimensions (`jax.export`).

A pruned callable exported with a symbolic batch is traced at shapes like
`(b, 224, 224, 3)`. Channels always have a static size; a symbolic dimension
is never tracked, never pruned, and counts as unknown in FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np


def var_shape(var: Any) -> tuple:
  """The shape of a jaxpr variable or literal (dimensions may be symbolic)."""
  return tuple(getattr(var.aval, 'shape', ()))


def is_static(dim: Any) -> bool:
  """Whether a dimension is a plain integer rather than a symbolic expression."""
  return isinstance(dim, (int, np.integer))


def static_prod(dims: Iterable[Any]) -> float:
  """The product of dimensions as a float; NaN when one of them is symbolic."""
  dims = list(dims)
  if not all(is_static(d) for d in dims):
    return math.nan
  return float(np.prod(dims, dtype=np.float64))


def same_avals(avals: Sequence[Any], args: Sequence[Any]) -> bool:
  """Whether `args` have the shapes and dtypes of `avals` (a trace's example arguments)."""
  return len(avals) == len(args) and all(
    tuple(a.shape) == tuple(jnp.shape(x)) and a.dtype == jnp.result_type(x)
    for a, x in zip(avals, args, strict=True)
  )
