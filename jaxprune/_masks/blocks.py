"""Block pooling and expansion for block-sparse masks (docs/explanation/semantics.md#blocks).

Blocks start at index 0 of both dimensions and the last block of a dimension
that is not a multiple of the block is partial. This keeps the pooled scores
aligned with the expanded mask (TF's SAME padding shifted them).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from jaxprune import _numerics as numerics


def _halving_sum(values: Array, axis: int) -> Array:
  """Sums over `axis` by adding halves: the same float additions, in the same
  order, whatever the shape of each device's shard. XLA's reduce picks its
  order per shape, so sharded and single-device block averages could differ in
  the last bit. Zero padding to a power of two adds exact zeros.

  Each halving is a window of two (`x[i] + x[i + width]`, one order: 0 + x0 is x0 for
  magnitudes, >= +0), which XLA computes in a loop over the window: a kernel computes
  the magnitudes it reads once in its code, however large the block. As sums of slices,
  a 4x4 block's kernel computed them 16 times, past XLA's limit of about 15, and XLA
  stored the magnitudes instead.
  """
  size = values.shape[axis]
  width = 1 << (size - 1).bit_length()
  if width != size:
    padding = [(0, 0)] * values.ndim
    padding[axis] = (0, width - size)
    values = jnp.pad(values, padding)
  while width > 1:
    width //= 2
    halves = values.reshape(values.shape[:axis] + (2, width) + values.shape[axis + 1 :])
    window = [1] * halves.ndim
    window[axis] = 2
    values = lax.reduce_window(halves, np.float32(0), lax.add, window, window, 'VALID')
    values = lax.squeeze(values, (axis,))
  return lax.squeeze(values, (axis,))


def pool(magnitudes: Array, block_dims: tuple[int, int], pooling: str) -> Array:
  """Pools a 2-D array of magnitudes (>= 0) over blocks aligned at index 0.

  Args:
    magnitudes: float32 (H, W), all >= 0.
    block_dims: resolved (bh, bw).
    pooling: 'AVG' averages the elements inside the array (partial blocks
      average fewer elements); 'MAX' takes their maximum.

  Returns:
    float32 (ceil(H / bh), ceil(W / bw)).
  """
  (height, width), (bh, bw) = magnitudes.shape, block_dims
  rows, cols = math.ceil(height / bh), math.ceil(width / bw)
  # Zero padding is neutral for MAX of magnitudes and for the AVG sums.
  padded = jnp.pad(magnitudes, ((0, rows * bh - height), (0, cols * bw - width)))
  blocks = padded.reshape(rows, bh, cols, bw)
  if pooling.upper() == 'MAX':
    return blocks.max(axis=(1, 3))
  row_counts = np.minimum(bh, height - bh * np.arange(rows))
  col_counts = np.minimum(bw, width - bw * np.arange(cols))
  counts = (row_counts[:, None] * col_counts[None, :]).astype(np.float32)
  sums = _halving_sum(_halving_sum(blocks, 3), 1)
  return numerics.div_rn(sums, jnp.asarray(counts))


def expand(pooled_mask: Array, block_dims: tuple[int, int], shape: tuple[int, int]) -> Array:
  """Repeats each pooled entry over its block and crops to `shape` (2-D)."""
  bh, bw = block_dims
  full = jnp.repeat(jnp.repeat(pooled_mask, bh, axis=0), bw, axis=1)
  return full[: shape[0], : shape[1]]
