"""Which mesh an array is typed with (for code that must step around explicit axes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax import Array


def explicit_mesh(arrays: Sequence[Array]) -> Any:
  """The mesh of the first array typed with explicit mesh axes, else None.

  Explicit axes (the default of `jax.make_mesh`) type every array with its
  sharding, and ops without a sharding rule (block reshapes, `lax.top_k`)
  refuse them; callers then run those ops under `jax.sharding.auto_axes`.
  """
  for array in arrays:
    mesh = getattr(jax.typeof(array).sharding, 'mesh', None)
    if mesh is not None and not mesh.empty and mesh.explicit_axes:
      return mesh
  return None
