"""The polynomial sparsity schedule and the mask-update gating.

See docs/explanation/semantics.md#schedule and #gating.

Zhu & Gupta 2017, "To prune, or not to prune", arXiv:1710.01878. The gating
rule is defined here once: `should_update` is the rule, applied inside jit;
`first_update_step` and `final_update_step` are its consequences for a run,
used by the hparams checks and by the main job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from jaxprune._config.fields import Fields

if TYPE_CHECKING:
  import ml_collections


def polynomial_sparsity(
  step: ArrayLike,
  *,
  initial: float,
  target: ArrayLike,
  begin_step: int,
  end_step: int,
  exponent: float,
) -> Array:
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


def sparsity_at(
  hparams: ml_collections.ConfigDict | Fields, step: ArrayLike, target: ArrayLike | None = None
) -> Array:
  """The sparsity of the schedule at `step`; `target` overrides `target_sparsity`.

  See docs/explanation/semantics.md#schedule.

  Example:
    >>> import jaxprune
    >>> hp = jaxprune.get_pruning_hparams()  # 0 -> 0.5 over steps 0..100, cubic
    >>> [round(float(jaxprune.sparsity_at(hp, t)), 4) for t in (0, 50, 100, 200)]
    [0.0, 0.4375, 0.5, 0.5]
  """
  return polynomial_sparsity(
    step,
    initial=hparams.initial_sparsity,
    target=hparams.target_sparsity if target is None else target,
    begin_step=hparams.sparsity_function_begin_step,
    end_step=hparams.sparsity_function_end_step,
    exponent=hparams.sparsity_function_exponent,
  )


def should_update(
  hparams: ml_collections.ConfigDict | Fields, step: ArrayLike, last_update_step: ArrayLike
) -> Array:
  """Whether masks are recomputed at `step` (docs/explanation/semantics.md#gating); a bool scalar.

  Masks change at step t when t >= begin_pruning_step, t <= end_pruning_step
  (unless -1) and t - last_update_step >= pruning_frequency. As in TF, updates
  count from the last update rather than on an aligned grid, and the pruning
  state's last_update_step starts at 0, so the first update is at
  `first_update_step(hparams)`.
  """
  step = jnp.asarray(step, jnp.int32)
  in_window = step >= hparams.begin_pruning_step
  if hparams.end_pruning_step >= 0:
    in_window &= step <= hparams.end_pruning_step
  # step - last rather than last + frequency: no int32 overflow near 2**31.
  return in_window & (step - last_update_step >= hparams.pruning_frequency)


def first_update_step(hparams: ml_collections.ConfigDict | Fields) -> int:
  """The step of the first mask update of a run, ignoring `end_pruning_step`.

  The first step t with `should_update(hparams, t, 0)` when the window does not
  end first: max(begin_pruning_step, pruning_frequency).
  """
  return max(hparams.begin_pruning_step, hparams.pruning_frequency)


def final_update_step(hparams: ml_collections.ConfigDict | Fields, num_steps: int) -> int | None:
  """The step of the last mask update of a run of `num_steps` update calls, or None.

  The calls are at steps 0 .. num_steps - 1; updates start at
  `first_update_step` and follow every `pruning_frequency` steps (counted from
  the last one) up to `end_pruning_step`.
  """
  first = first_update_step(hparams)
  last_allowed = num_steps - 1
  if hparams.end_pruning_step >= 0:
    last_allowed = min(last_allowed, hparams.end_pruning_step)
  if first > last_allowed:
    return None
  return first + (last_allowed - first) // hparams.pruning_frequency * hparams.pruning_frequency


def window_problems(hparams: ml_collections.ConfigDict | Fields) -> list[str]:
  """Why the mask updates cannot follow the schedule to its target, one line per cause.

  Valid settings whose updates stop before the schedule ends (the target is
  never reached), or start after it (the target is reached in one step).
  """
  problems = []
  end, schedule_end = hparams.end_pruning_step, hparams.sparsity_function_end_step
  if end != -1 and end < schedule_end:
    problems.append(
      f'end_pruning_step={end} stops mask updates before '
      f'sparsity_function_end_step={schedule_end}: the last update is at or before step '
      f'{end}, so the sparsity stays below target_sparsity={hparams.target_sparsity}. Set '
      'end_pruning_step >= sparsity_function_end_step (or -1) to reach the target.'
    )
  first = first_update_step(hparams)
  if first > schedule_end:
    problems.append(
      f'the first mask update is at step max(begin_pruning_step, pruning_frequency) = '
      f'{first}, after sparsity_function_end_step={schedule_end}, where the schedule has '
      f'already reached target_sparsity={hparams.target_sparsity}: the run prunes to the '
      f'target in one step at {first} (one-shot). To prune gradually, put the schedule '
      f'inside the pruning window (sparsity_function_begin_step={first}, '
      f'sparsity_function_end_step > {first}); for one-shot pruning on purpose, set '
      f'sparsity_function_end_step={first}.'
    )
  return problems
