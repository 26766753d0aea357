"""The polynomial sparsity schedule and the mask-update gating (SPEC sections 2 and 3)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
from jax import Array
from jax.typing import ArrayLike

from jaxprune.hparams import INT32_MAX, HParams


def polynomial_sparsity(step: ArrayLike, *, initial: float, target: ArrayLike, begin_step: int,
                        end_step: int, exponent: float) -> Array:
  """Zhu & Gupta's schedule: s(t) = target + (initial - target) * (1 - p) ** exponent.

  `p` is the fraction of [begin_step, end_step] elapsed at `step`, clipped to
  [0, 1], so s is `initial` before the begin step and `target` from the end step.

  Args:
    step: the training step (any integer scalar, traced or not).
    initial, target: sparsity at the begin and end of the schedule.
    begin_step, end_step: where the schedule starts and ends.
    exponent: 1 is linear; larger values prune faster early.

  Returns:
    A float32 scalar.
  """
  progress = (jnp.asarray(step, jnp.float32) - begin_step) / (end_step - begin_step)
  remaining = 1.0 - jnp.clip(progress, 0.0, 1.0)
  target = jnp.asarray(target, jnp.float32)
  return target + (initial - target) * remaining ** jnp.float32(exponent)


def sparsity_at(hparams: ml_collections.ConfigDict | HParams, step: ArrayLike,
                target: ArrayLike | None = None) -> Array:
  """The sparsity of SPEC section 2 at `step`; `target` overrides `target_sparsity`."""
  return polynomial_sparsity(
      step,
      initial=hparams.initial_sparsity,
      target=hparams.target_sparsity if target is None else target,
      begin_step=hparams.sparsity_function_begin_step,
      end_step=hparams.sparsity_function_end_step,
      exponent=hparams.sparsity_function_exponent)


def should_update(hparams: ml_collections.ConfigDict | HParams, step: ArrayLike,
                  last_update_step: ArrayLike) -> Array:
  """Whether masks are recomputed at `step` (SPEC section 3); a bool scalar.

  As in TF, updates count from the last update rather than on an aligned grid,
  so the first one is at max(begin_pruning_step, pruning_frequency).
  """
  step = jnp.asarray(step, jnp.int32)
  in_window = step >= hparams.begin_pruning_step
  if hparams.end_pruning_step >= 0:
    in_window &= step <= hparams.end_pruning_step
  # step - last rather than last + frequency: no int32 overflow near 2**31.
  return in_window & (step - last_update_step >= hparams.pruning_frequency)


def next_step(step: Array) -> Array:
  """step + 1, saturating at 2**31 - 1 instead of wrapping to negative steps.

  From there the step no longer advances, so masks freeze after one last update:
  at a thousand steps a second that is 24 days of training.
  """
  return jnp.where(step < INT32_MAX, step + 1, step)
