"""BatchNorm re-calibration after pruning (ENOT's `finetune_bn`).

Removing channels shifts the statistics every later normalisation layer sees,
so the running mean and variance are recomputed on a few calibration batches.

A train-mode step updates a running statistic as `new = m * old + (1 - m) * b`
with the layer's momentum `m` and the batch statistic `b`. Running the step
from `old = 0` and from `old = 1` gives `z = (1 - m) b` and `o = m + z`, hence
`b = z / (1 - o + z)` for any momentum; the new statistic is the mean of `b`
over the batches (a cumulative average, like PyTorch's `momentum=None`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jaxprune import _names as names
from jaxprune import _warnings as warnings_lib
from jaxprune.structured._core.progress import progress_bar

PyTree = Any


def recalibrate(
  update_fn: Callable[[PyTree, Any], PyTree],
  stats: PyTree,
  batches: Iterable[Any],
  progress: bool = False,
) -> PyTree:
  """Recomputes running statistics as the average of per-batch statistics.

  Args:
    update_fn: `update_fn(stats, batch) -> new stats`, one train-mode forward
      pass returning the updated running statistics (same pytree as `stats`).
    stats: the current running statistics (kept where a layer does not
      update, i.e. momentum 1).
    batches: calibration batches (inputs as `update_fn` expects them).
    progress: show a tqdm progress bar (when tqdm is installed).

  Returns:
    The re-estimated statistics.

  Raises:
    ValueError: when `batches` is empty.

  Warns:
    UserWarning: naming each batch whose statistics are NaN or Inf; it is left out of
      the average of each statistic it spoils.
  """
  step = jax.jit(
    lambda batch: (
      update_fn(jax.tree.map(jnp.zeros_like, stats), batch),
      update_fn(jax.tree.map(jnp.ones_like, stats), batch),
    )
  )
  if progress:
    batches = progress_bar(batches, 'batchnorm recalibration')
  total, counts, skipped, seen = None, None, {}, 0
  for index, batch in enumerate(batches):
    from_zero, from_one = step(batch)
    weight = jax.tree.map(lambda z, o: 1.0 - o + z, from_zero, from_one)  # 1 - momentum
    updates = jax.tree.map(lambda w: w > 1e-6, weight)  # momentum 1: the layer keeps its own
    batch_stat = jax.tree.map(
      lambda z, w, u: jnp.where(u, z / jnp.where(u, w, 1.0), 0.0), from_zero, weight, updates
    )
    # A batch with NaN or Inf (in its inputs, or overflowing) is left out of the average
    # of each statistic it spoils, and named below.
    finite = jax.tree.map(
      lambda z, o, b: (jnp.isfinite(z) & jnp.isfinite(o) & jnp.isfinite(b)).all(),
      from_zero,
      from_one,
      batch_stat,
    )
    finite = jax.device_get(finite)
    bad = [
      name
      for (name, _), ok in zip(names.named_leaves(finite), jax.tree.leaves(finite), strict=True)
      if not ok
    ]
    if bad:
      skipped[index] = bad
    batch_stat = jax.tree.map(lambda b, ok: jnp.where(ok, b, 0.0), batch_stat, finite)
    used = jax.tree.map(lambda u, ok: u & ok, updates, finite)
    if total is None:
      total, counts = batch_stat, jax.tree.map(lambda u: u.astype(jnp.int32), used)
    else:
      total = jax.tree.map(jnp.add, total, batch_stat)
      counts = jax.tree.map(lambda c, u: c + u, counts, used)
    seen = index + 1
  if total is None:
    raise ValueError('batches: recalibration needs at least one calibration batch.')
  if skipped:
    _warn_skipped(skipped, seen)
  return jax.tree.map(
    lambda t, c, old: jnp.where(c > 0, t / jnp.maximum(c, 1), old).astype(old.dtype),
    total,
    counts,
    stats,
  )


def _warn_skipped(skipped: dict[int, list[str]], seen: int) -> None:
  """One warning naming the batches left out of the average and what they spoiled."""
  parts = []
  for index, bad in list(skipped.items())[:5]:
    shown = ', '.join(bad[:3]) + (f' (+{len(bad) - 3} more)' if len(bad) > 3 else '')
    parts.append(f'batch {index} ({shown})')
  more = f' and {len(skipped) - 5} more batches' if len(skipped) > 5 else ''
  warnings_lib.warn(
    f'recalibrate: {len(skipped)} of {seen} calibration batches give NaN or Inf statistics, '
    f'left out of their averages: {"; ".join(parts)}{more}. A statistic no batch gave a '
    'finite value for keeps its old value; check those batches for NaN or Inf inputs.'
  )


def linen_update_fn(
  model: Any,
  variables: PyTree,
  collection: str = 'batch_stats',
  inputs: Callable[[Any], tuple] = lambda batch: (batch,),
  **train_kwargs: Any,
) -> Callable[[PyTree, Any], PyTree]:
  """`update_fn` for a Linen model: `model.apply(..., mutable=[collection])`.

  Args:
    model: the (pruned) Linen module, or any object with a Linen-style `apply`.
    variables: its variables; `collection` is replaced by the stats passed in.
    collection: the statistics collection.
    inputs: maps a batch to the positional model inputs.
    **train_kwargs: e.g. `train=True` to put BatchNorm in batch-statistics mode.

  Returns:
    `update_fn(stats, batch) -> new stats`.
  """

  def update_fn(stats, batch):
    _, updates = model.apply(
      {**variables, collection: stats}, *inputs(batch), mutable=[collection], **train_kwargs
    )
    return updates[collection]

  return update_fn


def recalibrate_nnx(
  model: Any,
  batches: Iterable[Any],
  inputs: Callable[[Any], tuple] = lambda batch: (batch,),
  progress: bool = False,
) -> Any:
  """Re-estimates every `nnx.BatchStat` of an NNX model in place.

  Args:
    model: the NNX model (eval/train mode is restored afterwards).
    batches: calibration batches.
    inputs: maps a batch to the positional model inputs.
    progress: show a tqdm progress bar.

  Returns:
    The same model.
  """
  from flax import nnx

  graphdef, stats, rest = nnx.split(model, nnx.BatchStat, ...)

  def update_fn(stats, batch):
    copy = nnx.merge(graphdef, stats, rest)
    # Only the normalisation layers switch mode; dropout stays as it is.
    for _, module in nnx.iter_modules(copy):
      if isinstance(module, nnx.BatchNorm):
        module.use_running_average = False
    copy(*inputs(batch))
    return nnx.state(copy, nnx.BatchStat)

  nnx.update(model, recalibrate(update_fn, stats, batches, progress))
  return model
