"""Plainly written numpy references of the one-shot rules (tests only): Wanda's and
magnitude's masks, SparseGPT's Algorithm 1, and a convolution's input patches."""

from __future__ import annotations

import numpy as np


def stable_prune(scores: np.ndarray, pruned: int) -> np.ndarray:
  """Bool mask pruning (True) the `pruned` lowest scores of a 1-d array, lower index first."""
  out = np.zeros(scores.shape, bool)
  out[np.argsort(scores, kind='stable')[:pruned]] = True
  return out


def row_counts(scores: np.ndarray, sparsity: float) -> np.ndarray:
  """How many entries each row of (outputs, inputs) `scores` prunes: `round(sparsity *
  size)` in all, `floor` of the share per row, and one more in the rows whose next
  candidate (the lowest score left) is lowest, the lower row first among equal ones."""
  rows = len(scores)
  each, extra = divmod(round(sparsity * scores.size), rows)
  next_scores = np.array([np.sort(row, kind='stable')[each] if extra else 0.0 for row in scores])
  counts = np.full(rows, each)
  counts[np.argsort(next_scores, kind='stable')[:extra]] += 1
  return counts


def row_mask(scores: np.ndarray, sparsity: float | None, nm: tuple[int, int] | None) -> np.ndarray:
  """Kept (True) entries of (outputs, inputs) `scores`: per row, its `row_counts` lowest
  pruned, or the m - n lowest of every m consecutive inputs."""
  keep = np.ones(scores.shape, bool)
  counts = row_counts(scores, sparsity) if nm is None else None
  for r, row in enumerate(scores):
    if nm is None:
      keep[r] = ~stable_prune(row, counts[r])
    else:
      n, m = nm
      for j in range(0, len(row), m):
        keep[r, j : j + m] = ~stable_prune(row[j : j + m], m - n)
  return keep


def wanda_mask(
  w: np.ndarray, x: np.ndarray, sparsity: float | None = None, nm: tuple[int, int] | None = None
) -> np.ndarray:
  """Wanda's kept entries of `w` (outputs, inputs) for input rows `x` (tokens, inputs)."""
  norms = np.sqrt((np.asarray(x, np.float64) ** 2).sum(0))
  return row_mask(np.abs(w) * norms, sparsity, nm)


def sparsegpt_reference(w, h, sparsity, nm, blocksize, percdamp):
  """Algorithm 1 of Frantar & Alistarh 2023 in float64, W as (outputs, inputs)."""
  w, h = w.astype(np.float64).copy(), h.astype(np.float64).copy()
  k = w.shape[1]
  dead = np.diag(h) == 0
  h[dead, dead] = 1.0
  w[:, dead] = 0.0
  h += percdamp * np.mean(np.diag(h)) * np.eye(k)
  u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U, U upper
  pruned = np.zeros(w.shape, bool)
  for i1 in range(0, k, blocksize):
    i2 = min(i1 + blocksize, k)
    w1, u1, err1 = w[:, i1:i2].copy(), u[i1:i2, i1:i2], np.zeros((w.shape[0], i2 - i1))
    p1 = np.zeros(w1.shape, bool)
    if nm is None:
      p1 = stable_prune((w1**2 / np.diag(u1) ** 2).ravel(), round(sparsity * w1.size)).reshape(
        w1.shape
      )
    for i in range(i2 - i1):
      if nm is not None and i % nm[1] == 0:
        tmp = w1[:, i : i + nm[1]] ** 2 / np.diag(u1)[i : i + nm[1]] ** 2
        for r in range(w1.shape[0]):
          p1[r, i : i + nm[1]] = stable_prune(tmp[r], nm[1] - nm[0])
      q = np.where(p1[:, i], 0.0, w1[:, i])
      err1[:, i] = (w1[:, i] - q) / u1[i, i]
      w1[:, i:] -= np.outer(err1[:, i], u1[i, i:])
      w1[:, i] = q
    w[:, i1:i2] = w1
    w[:, i2:] -= err1 @ u[i1:i2, i2:]
    pruned[:, i1:i2] = p1
  return w, ~pruned


def conv_patches(
  x: np.ndarray,
  window: tuple[int, int],
  stride: int,
  padding: tuple[tuple[int, int], tuple[int, int]],
  dilation: int,
  groups: int,
) -> np.ndarray:
  """The input rows of a 2-d convolution, NHWC input, by loops: (groups, tokens, K), row
  (n, i, j) of group g holding x[n, i * stride + a * dilation, j * stride + b * dilation,
  c] for the kernel positions (a, b) and the group's channels c, ordered (a, b, c)."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), padding[0], padding[1], (0, 0)))
  n, height, width, channels = x.shape
  kh, kw = window
  out_h = (height - dilation * (kh - 1) - 1) // stride + 1
  out_w = (width - dilation * (kw - 1) - 1) // stride + 1
  per = channels // groups
  rows = np.zeros((groups, n * out_h * out_w, kh * kw * per))
  for g in range(groups):
    t = 0
    for b in range(n):
      for i in range(out_h):
        for j in range(out_w):
          patch = [
            x[b, i * stride + p * dilation, j * stride + q * dilation, g * per + c]
            for p in range(kh)
            for q in range(kw)
            for c in range(per)
          ]
          rows[g, t] = patch
          t += 1
  return rows
