"""Which mesh an array is typed with, and running code that must step around explicit axes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def on_any_mesh(fn: Callable[..., Any], out_sharding: Callable[[Any], Any], *args: Any) -> Any:
  """`fn(*args)`, also when arrays among `args` are typed with explicit mesh axes.

  Explicit axes (the default of `jax.make_mesh`) type every array with its sharding,
  and ops without a sharding rule for them (the block reshapes, `lax.top_k`) refuse
  them. There `fn` runs under `jax.sharding.auto_axes`, which XLA's partitioner shards
  as under `pjit`, and its results come back with the shardings `out_sharding(mesh)`
  gives (a pytree like `fn`'s result). Values `fn` closes over keep their explicit
  types: pass them in `args`.
  """
  mesh = explicit_mesh(jax.tree.leaves(args))
  if mesh is None:
    return fn(*args)
  return jax.sharding.auto_axes(fn, out_sharding=out_sharding(mesh))(*args)


def sharded_like(array: Array) -> Callable[[Any], Any]:
  """The `out_sharding` of `on_any_mesh` for a result sharded as `array` is."""

  def out_sharding(mesh):
    del mesh  # `array`'s type holds it
    return jax.typeof(array).sharding

  return out_sharding
