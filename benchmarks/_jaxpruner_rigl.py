"""jaxpruner's RigL on the digits CNN, for benchmarks/sparse_training.py (runs in jaxpruner's venv).

Prints one JSON line: {"accuracy": {sparsity: [per seed]}, "step_ms": {...}, "versions": ...}.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import jax
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _digits_cnn as task_lib  # noqa: E402
import jaxpruner  # noqa: E402


def rigl(sparsity: float):
  """jaxpruner's RigL with the knobs of our rows: ERK, every 50 steps to 75%, cosine 0.3."""
  return jaxpruner.RigL(
    scheduler=jaxpruner.sparsity_schedules.PeriodicSchedule(
      update_freq=task_lib.UPDATE_FREQ,
      update_start_step=task_lib.UPDATE_FREQ,
      update_end_step=task_lib.END_STEP,
    ),
    sparsity_distribution_fn=functools.partial(
      jaxpruner.sparsity_distributions.erk, sparsity=sparsity
    ),
    drop_fraction_fn=optax.cosine_decay_schedule(task_lib.DROP_FRACTION, task_lib.END_STEP),
  )


def main() -> None:
  accuracy = {}
  for sparsity in task_lib.SPARSITIES:
    accuracy[sparsity] = []
    for seed in task_lib.SEEDS:
      model, params, dataset, batches = task_lib.task(seed)
      pruner = rigl(sparsity)
      acc, _, _ = task_lib.train(
        model,
        pruner.wrap_optax(optax.adam(task_lib.LR)),
        params,
        dataset,
        batches,
        post=pruner.post_gradient_update,
      )
      accuracy[sparsity].append(acc)
  model, params, dataset, batches = task_lib.task(0)
  pruner = rigl(task_lib.SPARSITIES[-1])
  times = task_lib.step_times(
    model,
    {'dense': optax.adam(task_lib.LR), 'rigl': pruner.wrap_optax(optax.adam(task_lib.LR))},
    params,
    dataset,
    batches,
    posts={'rigl': pruner.post_gradient_update},
  )
  print(
    json.dumps(
      {
        'accuracy': accuracy,
        'step_ms': {k: 1e3 * v for k, v in times.items()},
        'versions': f'jax {jax.__version__}, optax {optax.__version__}',
      }
    )
  )


if __name__ == '__main__':
  main()
