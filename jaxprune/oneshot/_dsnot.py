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
SparseGPT the kept weights are its updated ones. Where a row's reconstruction error
`||(W_i - W'_i) X||^2` on the calibration inputs ends up larger than before, the row keeps the
method's weights, so DSnoT never makes a layer's error worse (the official code has no such
check).
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


def row_errors(d: jax.Array, gram: jax.Array) -> jax.Array:
  """`d_i G d_i^T` per row of d (outputs, inputs), rows in `groups` blocks, each with its
  group's Gram matrix (groups, inputs, inputs)."""
  groups = gram.shape[0]
  grouped = d.reshape(groups, -1, d.shape[1])
  energy = jnp.sum(jnp.matmul(grouped, gram, precision=_HIGHEST) * grouped, axis=2)
  return energy.reshape(-1)


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
    gram: `X^T X` per feature group (groups, inputs, inputs), for the final check.
    nm: the N:M pattern, or None.
    config: the cycles and threshold.

  Returns:
    The new weights and mask; each row prunes as many weights as before.
  """
  cols = jnp.arange(w.shape[1])
  grow_gain = w * mean  # e_i falls by this when weight ij grows back
  var = jnp.maximum(var, jnp.finfo(jnp.float32).tiny)
  start = jnp.sum((w - new) * mean, axis=1)
  sign0 = jnp.sign(start)

  def cycle(_, state):
    v, keep, touched, err, active = state
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
    take = jnp.take_along_axis
    after = (
      err
      + take(v * mean, pruned[:, None], axis=1)[:, 0]
      - take(grow_gain, grown[:, None], axis=1)[:, 0]
    )
    ok = active & jnp.any(grow_ok, axis=1) & jnp.any(prune_ok, axis=1)
    ok &= jnp.abs(err) > config.threshold
    if nm is not None:
      ok &= jnp.sign(after) == sign0
    at_grown = (cols[None, :] == grown[:, None]) & ok[:, None]
    at_pruned = (cols[None, :] == pruned[:, None]) & ok[:, None]
    v = jnp.where(at_grown, w, jnp.where(at_pruned, 0.0, v))
    keep = (keep | at_grown) & ~at_pruned
    touched = touched | at_grown | at_pruned
    return v, keep, touched, jnp.where(ok, after, err), ok

  init = (new, mask, jnp.zeros_like(mask), start, jnp.ones(w.shape[0], bool))
  v, keep, *_ = jax.lax.fori_loop(0, config.max_cycle, cycle, init)
  better = row_errors(w - v, gram) <= row_errors(w - new, gram)
  return jnp.where(better[:, None], v, new), jnp.where(better[:, None], keep, mask)
