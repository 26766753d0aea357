"""Slow, plainly written numpy references of thresholds, blocks and N:M masks (tests only).

See docs/explanation/semantics.md#histogram-thresholds and #blocks. Every float32
operation that the semantics name (`a / m`, `nbins * q`,
`count / N`, `bins / nbins`, `* m`) is a numpy float32 operation, which is
correctly rounded (IEEE 754); counting is done on integers.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def histogram_rule(
  magnitudes: np.ndarray, sparsity: float, nbins: int
) -> tuple[np.float32, int, np.ndarray]:
  """TF's histogram threshold on magnitudes (max > 0, finite).

  See docs/explanation/semantics.md#histogram-thresholds.

  Returns:
    (threshold, first, bins): `first` is the number of bins whose CDF is below
    the sparsity (the index of the first bin whose CDF reaches it), `bins` the
    bin of every element.
  """
  a = np.asarray(magnitudes, F32).ravel()
  m = a.max()
  quotient = a / m  # float32 / float32: correctly rounded.
  bins = np.clip(np.floor(F32(nbins) * quotient), 0, nbins - 1).astype(np.int64)
  counts = np.bincount(bins, minlength=nbins)
  cdf = np.cumsum(counts).astype(F32) / F32(a.size)
  first = int(np.sum(cdf < F32(sparsity)))
  threshold = (F32(first) / F32(nbins)) * m
  return F32(threshold), first, bins


def keep_count(total: int, sparsity: float) -> int:
  """tfmot's k = max(round(N * (1 - s)), 1), in exact arithmetic on the float32 sparsity."""
  return max(int(np.round(total * (1.0 - float(F32(sparsity))))), 1)


def exact_rule(magnitudes: np.ndarray, sparsity: float) -> np.float32:
  """The k-th largest magnitude (k = keep_count), by a full sort."""
  a = np.sort(np.asarray(magnitudes, F32).ravel())[::-1]
  return F32(a[keep_count(a.size, sparsity) - 1])


def threshold_and_mask(
  magnitudes: np.ndarray, sparsity: float, nbins: int, method: str
) -> tuple[np.float32, np.ndarray]:
  """(threshold, mask) on magnitudes: `a > thr` (histogram) or `a >= thr` (exact)."""
  a = np.asarray(magnitudes, F32)
  if method == 'histogram':
    threshold = histogram_rule(a, sparsity, nbins)[0]
    return threshold, a > threshold
  threshold = exact_rule(a, sparsity)
  return threshold, a >= threshold


def pool(magnitudes: np.ndarray, bh: int, bw: int, pooling: str) -> np.ndarray:
  """Pools a 2-D array over blocks aligned at 0, one block at a time.

  See docs/explanation/semantics.md#blocks.
  """
  height, width = magnitudes.shape
  rows, cols = math.ceil(height / bh), math.ceil(width / bw)
  out = np.zeros((rows, cols), F32)
  for i in range(rows):
    for j in range(cols):
      block = magnitudes[i * bh : (i + 1) * bh, j * bw : (j + 1) * bw]
      if pooling == 'MAX':
        out[i, j] = block.max()
      else:
        # Test data keep block sums exact in float32; the mean is one rounded quotient.
        out[i, j] = F32(block.astype(np.float64).sum()) / F32(block.size)
  return out


def block_mask(
  weights: np.ndarray,
  sparsity: float,
  block_dims: tuple[int, int],
  pooling: str,
  nbins: int,
  method: str,
) -> tuple[np.float32, np.ndarray]:
  """(threshold, mask) of block pruning for weights whose squeezed shape is 2-D.

  See docs/explanation/semantics.md#blocks.
  """
  a = np.abs(np.asarray(weights, F32))
  squeezed = a.reshape([d for d in a.shape if d != 1])
  assert squeezed.ndim == 2
  bh, bw = (d if b == -1 else b for b, d in zip(block_dims, squeezed.shape, strict=True))
  pooled = pool(squeezed, bh, bw, pooling)
  threshold, pooled_mask = threshold_and_mask(pooled, sparsity, nbins, method)
  mask = np.zeros(squeezed.shape, bool)
  for i in range(squeezed.shape[0]):
    for j in range(squeezed.shape[1]):
      mask[i, j] = pooled_mask[i // bh, j // bw]
  return threshold, mask.reshape(weights.shape)


def nm_mask(weights: np.ndarray, n: int, m: int) -> np.ndarray:
  """Keeps the n largest |w| of every m consecutive entries along axis -2 (tie-free data)."""
  w = np.abs(np.asarray(weights))
  mask = np.zeros(w.shape, bool)
  moved = np.moveaxis(w, -2, -1)
  out = np.moveaxis(mask, -2, -1)  # a view: writing it writes `mask`.
  for index in np.ndindex(moved.shape[:-1]):
    for start in range(0, moved.shape[-1], m):
      group = moved[index][start : start + m]
      for k in np.argsort(-group, kind='stable')[:n]:
        out[index + (start + k,)] = True
  return mask
