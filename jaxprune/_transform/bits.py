"""Bool masks packed eight to a byte along their last axis.

A mask update hands its masks out of the step's conditional this way: a conditional's
results are buffers of their own, and at one bit a weight they cost 1/32 of float32
params instead of a quarter (docs/explanation/semantics.md#applying-the-masks).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

# numpy, not jnp: a jax array made at import would start JAX's backend (before
# jax.distributed.initialize can run, in the main job).
_WEIGHTS = 2 ** np.arange(8, dtype=np.uint8)


def packed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape of `packed(mask)` for a mask of `shape`."""
  shape = tuple(shape) or (1,)
  return shape[:-1] + (-(-shape[-1] // 8),)


@jax.jit
def packed(mask: Array) -> Array:
  """uint8 bytes of `mask`'s bits along its last axis, the first entry in the lowest bit."""
  mask = jnp.atleast_1d(mask)
  pad = -mask.shape[-1] % 8
  if pad:
    mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)])
  groups = mask.reshape(*mask.shape[:-1], -1, 8).astype(jnp.uint8)
  return jnp.sum(groups * _WEIGHTS, axis=-1, dtype=jnp.uint8)


@functools.partial(jax.jit, static_argnums=1)
def unpacked(packed_mask: Array, shape: tuple[int, ...]) -> Array:
  """The bool mask of `shape` that `packed` turned into `packed_mask`.

  Bits are spread along a new last axis and merged into the one before it, a reshape that
  keeps an array sharded along that axis where it lies.
  """
  size = shape[-1] if shape else 1
  spread = (packed_mask[..., None] >> np.arange(8, dtype=np.uint8)) & 1
  mask = spread.reshape(*packed_mask.shape[:-1], -1).astype(bool)
  if mask.shape[-1] != size:
    mask = mask[..., :size]
  return mask.reshape(shape)
