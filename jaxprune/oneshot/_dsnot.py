"""DSnoT (Zhang et al. 2023, arXiv 2310.08915, "Dynamic Sparse No Training"): a training-free
fix-up of a pruned layer's mask, by swaps within each output row.

Row i's expected reconstruction error per token is `e_i = sum_j (W_ij - W'_ij) * E[x_j]`, `W`
the dense weights, `W'` the pruned ones. While `|e_i|` exceeds the threshold (and for at most
`max_cycle` cycles), each cycle swaps one pair in the row, keeping its count of zeros:

* grow the pruned weight whose return moves `e_i` towards 0 the most per unit of input
  variance: of those with `W_ij E[x_j]` of the sign of `e_i`, the largest
  `|W_ij E[x_j]| / Var[x_j]` (it comes back with its dense value);
* prune the kept weight of least Wanda score `|W'_ij| * ||X_j||_2` among those whose
  `W'_ij E[x_j]` has the other sign (for N:M: among the kept weights of the grown weight's
  group of M, whatever their sign, so that the group keeps N).

A weight swapped once is not swapped again. For N:M a row also stops when a swap would flip
the sign `e_i` started with. This follows the official code (github.com/zyxxmu/DSnoT,
`prune_DSnoT`: its defaults `pow_of_var_regrowing=1`, `without_same_sign=True` for
unstructured targets and the sign check for N:M), on the weights the method left: after
SparseGPT the kept weights are its updated ones. The expected error is only the mean's part
of the row's reconstruction error `||(W_i - W'_i) X||^2` on the calibration inputs, which a
swap can make larger; so the row's error is tracked exactly (from the Gram matrix `X^T X`)
along its swaps, and each row keeps its swaps up to the one after which that error was least
(none, where every swap made it larger). DSnoT thus never makes a layer's error worse; the
official code keeps every swap.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class DSnoT:
  """DSnoT's mask fix-up (Zhang et al. 2023, arXiv 2310.08915) for `oneshot.prune(dsnot=)`.

  Attributes:
    max_cycle: the most swaps per output row (the official `max_cycle_time`, 50).
    threshold: a row stops once `|e_i|`, its expected reconstruction error per token, is at
      most this. The official `update_threshold=0.1` is on the error summed over a
      2,048-token sequence: 0.1 / 2048 ~ 5e-5 per token, the default here.
  """

  max_cycle: int = 50
  threshold: float = 5e-5


def check(dsnot: DSnoT) -> None:
  """A ValueError for a bad field."""
  cycles = dsnot.max_cycle
  if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
    raise ValueError(
      f'dsnot.max_cycle={cycles!r}: must be an integer >= 0, e.g. DSnoT(max_cycle=50).'
    )
  threshold = dsnot.threshold
  if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
    raise ValueError(f'dsnot.threshold={threshold!r}: must be a number >= 0, e.g. 5e-5.')


def fix_up(
  w: jax.Array,
  new: jax.Array,
  mask: jax.Array,
  mean: jax.Array,
  var: jax.Array,
  norm: jax.Array,
  gram: jax.Array,
  *,
  nm: tuple[int, int] | None,
  config: DSnoT,
) -> tuple[jax.Array, jax.Array]:
  """(weights, mask) after DSnoT's swaps; traced inside the caller's `jit`.

  Args:
    w: the dense weights, float32 (outputs, inputs).
    new: the method's weights (zero where pruned).
    mask: the method's mask (True = kept).
    mean, var, norm: `E[x_j]`, `Var[x_j]` and `||X_j||_2` of each row's inputs, (outputs,
      inputs).
    gram: `X^T X` per feature group (groups, inputs, inputs); output row `i` reads group
      `i // (outputs / groups)`.
    nm: the N:M pattern, or None.
    config: the cycles and threshold.

  Returns:
    The new weights and mask; each row prunes as many weights as before.
  """
  rows, cols = jnp.arange(w.shape[0]), jnp.arange(w.shape[1])
  group = rows // (w.shape[0] // gram.shape[0])
  grow_gain = w * mean  # e_i falls by this when weight ij grows back
  var = jnp.maximum(var, jnp.finfo(jnp.float32).tiny)
  start = jnp.sum((w - new) * mean, axis=1)
  sign0 = jnp.sign(start)
  diff = (w - new).reshape(gram.shape[0], -1, w.shape[1])
  # g = (W - W') G per row, and the row's exact error (W - W') G (W - W')^T.
  g0 = jnp.matmul(diff, gram, precision=_HIGHEST).reshape(w.shape)
  error0 = jnp.sum(g0 * (w - new), axis=1)

  def cycle(_, state):
    v, keep, touched, err, active, g, error, best = state
    s = jnp.sign(err)[:, None]
    grow_ok = ~keep & ~touched & (s * grow_gain > 0)
    free = keep & ~touched
    if nm is not None:
      m = nm[1]
      # Only groups with a kept weight left to prune can take a grown one.
      open_group = jnp.any(free.reshape(w.shape[0], -1, m), axis=2)
      grow_ok &= jnp.repeat(open_group, m, axis=1)
    grown = jnp.argmax(jnp.where(grow_ok, s * grow_gain / var, -jnp.inf), axis=1)
    if nm is None:
      prune_ok = free & (s * v * mean < 0)
    else:
      prune_ok = free & (cols[None, :] // nm[1] == (grown // nm[1])[:, None])
    pruned = jnp.argmin(jnp.where(prune_ok, jnp.abs(v) * norm, jnp.inf), axis=1)
    dj = -w[rows, grown]  # W - W' at the grown weight: from w to 0
    dp = v[rows, pruned]  # at the pruned one: from w - v to w
    after = err + dp * mean[rows, pruned] + dj * mean[rows, grown]
    ok = active & jnp.any(grow_ok, axis=1) & jnp.any(prune_ok, axis=1)
    ok &= jnp.abs(err) > config.threshold
    if nm is not None:
      ok &= jnp.sign(after) == sign0
    new_error = (
      error
      + 2 * (dj * g[rows, grown] + dp * g[rows, pruned])
      + dj**2 * gram[group, grown, grown]
      + dp**2 * gram[group, pruned, pruned]
      + 2 * dj * dp * gram[group, grown, pruned]
    )
    at_grown = (cols[None, :] == grown[:, None]) & ok[:, None]
    at_pruned = (cols[None, :] == pruned[:, None]) & ok[:, None]
    v = jnp.where(at_grown, w, jnp.where(at_pruned, 0.0, v))
    keep = (keep | at_grown) & ~at_pruned
    touched = touched | at_grown | at_pruned
    step = gram[group, :, grown] * dj[:, None] + gram[group, :, pruned] * dp[:, None]
    g = jnp.where(ok[:, None], g + step, g)
    error = jnp.where(ok, new_error, error)
    best_v, best_keep, best_error = best
    better = ok & (error < best_error)
    best = (
      jnp.where(better[:, None], v, best_v),
      jnp.where(better[:, None], keep, best_keep),
      jnp.where(better, error, best_error),
    )
    return v, keep, touched, jnp.where(ok, after, err), ok, g, error, best

  init = (
    new,
    mask,
    jnp.zeros_like(mask),
    start,
    jnp.ones(w.shape[0], bool),
    g0,
    error0,
    (new, mask, error0),
  )
  best_v, best_keep, _ = jax.lax.fori_loop(0, config.max_cycle, cycle, init)[-1]
  return best_v, best_keep
