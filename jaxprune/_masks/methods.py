"""Pruning methods for one array: the `compute_mask` protocol and the built-in rules.

A pruning method is any object with `compute_mask(weights, previous_mask)`
returning a bool mask (True = kept) of the shape of `weights`, like
`torch.nn.utils.prune.BasePruningMethod.compute_mask`. The built-in methods
follow torch's semantics:

- `amount` is a count when it is an `int` (`3` prunes three entries) and a
  fraction when it is a `float` (`0.3` prunes `round(0.3 * n)` entries, with
  Python's round-half-to-even, as torch does);
- iterative pruning composes like torch's `PruningContainer`: the amount is
  relative to what the previous mask still keeps (entries for unstructured
  methods, slices for `LnStructured`), the new mask is computed on those only,
  and entries pruned before stay pruned;
- ties are broken deterministically, by jaxprune's one rule (`jaxprune._masks.ranking`):
  entries are ranked by score, largest first, and among equal scores the lower
  flat index ranks higher (as `lax.top_k` does), so the higher index is pruned
  first. NaN scores rank as the largest (kept), as in `torch.topk`.

Every method is pure and jittable for a fixed `amount`. When the previous mask
is a traced value (the whole call is under `jit`), the number of unpruned
entries is only known on the device: a fractional amount is then turned into
a count by a host callback running torch's Python rule, `round(amount * n)`
(float32 on the device would get 45 * 0.7 = 31.4999... wrong: 31.5, then 32),
and an integer amount larger than the number of unpruned entries is clipped
instead of raising. Host callbacks cannot be serialised by `jax.export`: export
such a step with the previous mask concrete (or an integer amount).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._config.maps import parse_nm
from jaxprune._masks import ranking as ranking
from jaxprune._masks.nm import nan_largest_magnitudes, nm_mask_from_scores


@runtime_checkable
class PruningMethod(Protocol):
  """What a custom pruning criterion implements (torch's `BasePruningMethod`)."""

  def compute_mask(self, weights: jax.Array, previous_mask: jax.Array) -> jax.Array:
    """Returns the new bool mask (True = kept) for `weights`.

    Args:
      weights: the leaf's values with the previous mask applied (pruned
        entries are 0), or the importance scores passed instead.
      previous_mask: bool, same shape; all True when the leaf was not pruned
        before. The caller ANDs the result with it, so entries pruned earlier
        stay pruned whatever this returns.
    """
    ...


def validate_amount(amount: Any) -> None:
  """Checks a static pruning amount: an int >= 0 (a count) or a float in [0, 1] (a fraction).

  Raises:
    TypeError: for a bool or a non-number.
    ValueError: for a negative count or a fraction outside [0, 1].
  """
  if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
    raise TypeError(
      f'amount={amount!r}: expected an int count (e.g. 3) or a float fraction (e.g. 0.3)'
    )
  if isinstance(amount, numbers.Integral):
    if amount < 0:
      raise ValueError(f'amount={amount}: a count must be >= 0')
  elif not 0.0 <= amount <= 1.0:
    raise ValueError(f'amount={amount}: a fraction must be in [0, 1]; pass an int for a count')


def _as_python_int(x: jax.Array | int) -> int | None:
  """`int(x)` when `x` is concrete, None when it is traced."""
  try:
    return int(x)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    return None


def _round_count(amount: float, n_alive: np.ndarray) -> np.ndarray:
  """torch's count for a fraction, in Python's float64: `round(amount * n)`, half to even."""
  return np.asarray(round(amount * int(n_alive)), np.int32)


def _count_to_prune(amount: int | float, n_alive: jax.Array | int) -> jax.Array | int:
  """Entries to prune out of `n_alive` for `amount` (torch's `_compute_nparams_toprune`)."""
  n_static = _as_python_int(n_alive)
  if n_static is not None:
    if isinstance(amount, numbers.Integral):
      if amount > n_static:
        raise ValueError(
          f'amount={amount} is larger than the {n_static} entries that can still be '
          f'pruned; pass a smaller count or a fraction'
        )
      return int(amount)
    return round(amount * n_static)
  if isinstance(amount, numbers.Integral):
    return jnp.minimum(amount, n_alive)
  return jax.pure_callback(
    functools.partial(_round_count, float(amount)),
    jax.ShapeDtypeStruct((), jnp.int32),
    n_alive,
    vmap_method='sequential',
  )


def prune_lowest(
  scores: jax.Array, amount: int | float, previous_mask: jax.Array | None = None
) -> jax.Array:
  """Prunes the `amount` lowest-scoring entries among those still unpruned.

  The building block of the built-in methods, public so that a custom
  criterion only has to compute its scores. Costs one sort of `scores`.

  Args:
    scores: any shape; higher means more important.
    amount: an int count or a float fraction of the entries still unpruned.
    previous_mask: bool with the shape of `scores`, or None (nothing pruned).

  Returns:
    A bool mask with the shape of `scores`: False for the entries pruned
    before and for the newly pruned ones.
  """
  validate_amount(amount)
  flat = scores.reshape(-1)
  if jnp.issubdtype(flat.dtype, jnp.inexact):
    flat = jnp.where(jnp.isnan(flat), jnp.inf, flat)
  if previous_mask is None:
    alive = jnp.ones(flat.shape, bool)
    n_alive = flat.size
  else:
    if previous_mask.shape != scores.shape:
      raise ValueError(
        f'previous_mask has shape {previous_mask.shape}, scores have shape '
        f'{scores.shape}; they must match'
      )
    alive = previous_mask.reshape(-1).astype(bool)
    n_alive = jnp.sum(alive, dtype=jnp.int32)
  pruned = ranking.lowest_k(flat, _count_to_prune(amount, n_alive), among=alive)
  return (alive & ~pruned).reshape(scores.shape)


@dataclasses.dataclass(frozen=True)
class L1Unstructured:
  """Prunes the entries of smallest magnitude (torch's `L1Unstructured`)."""

  amount: int | float

  def __post_init__(self):
    validate_amount(self.amount)

  def compute_mask(self, weights: jax.Array, previous_mask: jax.Array) -> jax.Array:
    return prune_lowest(jnp.abs(weights), self.amount, previous_mask)


@dataclasses.dataclass(frozen=True)
class RandomUnstructured:
  """Prunes `amount` entries chosen uniformly at random (torch's `RandomUnstructured`).

  Exactly `amount` of the still-unpruned entries are pruned; which ones is a
  function of `key` only.
  """

  amount: int | float
  key: jax.Array

  def __post_init__(self):
    validate_amount(self.amount)

  def compute_mask(self, weights: jax.Array, previous_mask: jax.Array) -> jax.Array:
    scores = jax.random.uniform(self.key, weights.shape)
    return prune_lowest(scores, self.amount, previous_mask)


@dataclasses.dataclass(frozen=True)
class LnStructured:
  """Prunes whole slices along `axis` by their Ln norm (torch's `LnStructured`).

  The norm of slice `i` is taken over all the other axes of `weights`. A slice
  counts as still unpruned when any of its entries is (torch's rule), and the
  amount is a count or fraction of those slices.
  """

  amount: int | float
  n: float
  axis: int

  def __post_init__(self):
    validate_amount(self.amount)
    if isinstance(self.n, bool) or not isinstance(self.n, numbers.Real) or not self.n > 0:
      raise ValueError(
        f'n={self.n!r}: the norm order must be a number > 0 (1, 2, ...) or float("inf")'
      )

  def compute_mask(self, weights: jax.Array, previous_mask: jax.Array) -> jax.Array:
    if weights.ndim < 2:
      raise ValueError(
        f'ln_structured: weights of shape {weights.shape} have fewer than 2 dimensions; '
        f'structured pruning removes slices of a multi-dimensional leaf'
      )
    if not -weights.ndim <= self.axis < weights.ndim:
      raise ValueError(f'ln_structured: axis={self.axis} is out of range for shape {weights.shape}')
    axis = self.axis % weights.ndim
    others = tuple(d for d in range(weights.ndim) if d != axis)
    norms = jnp.linalg.vector_norm(weights, ord=self.n, axis=others)
    alive = jnp.any(previous_mask, axis=others)
    keep = prune_lowest(norms, self.amount, alive)
    return previous_mask & jnp.expand_dims(keep, others)


@dataclasses.dataclass(frozen=True)
class NMStructured:
  """Keeps the `n` largest of every `m` consecutive entries along `axis` (see `nm_mask`).

  With a previous mask, entries pruned before score below every unpruned one,
  so each group keeps at most `n` entries and never revives pruned ones.
  """

  n: int
  m: int
  axis: int = -2

  def __post_init__(self):
    parse_nm((self.n, self.m))

  def compute_mask(self, weights: jax.Array, previous_mask: jax.Array) -> jax.Array:
    scores = jnp.where(previous_mask, nan_largest_magnitudes(weights), -1)
    return previous_mask & nm_mask_from_scores(scores, self.n, self.m, self.axis)
