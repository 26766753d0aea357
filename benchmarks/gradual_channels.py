"""Gradual channel pruning against one-shot pruning and the small model from scratch.

The digits CNN of `jaxprune_train` (16-32 conv channels, 64 dense), 3000
training steps for every candidate (batch 64, adam 1e-3), ending with the
same architecture (8-16 conv channels, 32 dense: equal FLOPs, checked):

- gradual: `configs/digits_cnn_channels.py`, dense for 500 steps, 50% of the
  channels of every group removed on the cubic schedule by step 2000
  (`jaxprune.pruning(..., mask_rule=ChannelRule)`), 1000 steps of
  fine-tuning, then shrunk;
- one-shot at step s (s = 500, 2000): the dense model trained s steps, 50% of
  each group's channels removed by L2 (`select(ratio=0.5)`, `apply_plan`),
  then the small model fine-tuned for the remaining 3000 - s steps (a fresh
  adam state);
- from scratch: the 8-16/32 CNN trained 3000 steps.

Every candidate sees the same batches (the job's batch order for its seed).
Three seeds (init and batch order); test accuracy of the final small model.

Run: `python -m benchmarks.gradual_channels` (about 5 minutes on 2 cores;
`--quick` runs 300 steps and one seed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import optax

import jaxprune_train as train_lib
from jaxprune.structured import Constraint, apply_plan, plan_flops, select, trace

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, 'configs')]
import digits_cnn_channels  # noqa: E402

from benchmarks._common import init_params, test_accuracy  # noqa: E402
from benchmarks._timing import table  # noqa: E402


def _config(seed: int, steps: int):
  config = digits_cnn_channels.get_config()
  config.seed = seed
  config.progress_bar = config.tensorboard = config.plots = False
  if steps != config.num_steps:  # --quick: the same schedule, compressed
    scale = steps / config.num_steps
    config.num_steps = steps
    for field in (
      'begin_pruning_step',
      'end_pruning_step',
      'sparsity_function_begin_step',
      'sparsity_function_end_step',
      'pruning_frequency',
    ):
      config.pruning[field] = max(1, round(config.pruning[field] * scale))
  config.eval_every = config.checkpoint_every = config.log_every = steps
  return config


def gradual(seed: int, steps: int) -> tuple[float, float]:
  """(test accuracy of the exported shrunk model, its FLOPs per image)."""
  result = train_lib.train(_config(seed, steps))
  history = [r for r in result.history if 'flops_after' in r][-1]
  return history['test_accuracy'], history['flops_after']


def _train(apply_fn, params, dataset, seed: int, first: int, steps: int):
  tx = optax.adam(1e-3)
  state = train_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  step = jax.jit(train_lib.make_train_step(apply_fn, tx))
  for t in range(first, first + steps):
    state, _ = step(state, train_lib.get_batch(dataset, seed, t, 64))
  return state.params


def one_shot(seed: int, steps: int, at: int, dataset) -> tuple[float, float]:
  """Dense for `at` steps, 50% of the channels by L2, fine-tuned for the rest."""
  model = train_lib.CNN(features=(16, 32), dense=64, num_classes=10)
  params = init_params(model, dataset.x_train.shape[1:], seed)
  params = _train(model.apply, params, dataset, seed, 0, at)
  example = dataset.x_test[:2]
  graph = trace(model.apply, {'params': params}, example)
  plan = select(
    graph, {'params': params}, ratio=0.5, importance='l2', constraint=Constraint(round_to=8)
  )
  variables, pruned_fn = apply_plan(graph, {'params': params}, plan)
  params = _train(pruned_fn, variables['params'], dataset, seed, at, steps - at)
  accuracy = test_accuracy(pruned_fn, params, dataset.x_test, dataset.y_test)
  return accuracy, plan_flops(graph, plan) / 2


def scratch(seed: int, steps: int, dataset) -> tuple[float, float]:
  """The small architecture itself, trained for all the steps."""
  model = train_lib.CNN(features=(8, 16), dense=32, num_classes=10)
  params = init_params(model, dataset.x_train.shape[1:], seed)
  params = _train(model.apply, params, dataset, seed, 0, steps)
  graph = trace(model.apply, {'params': params}, dataset.x_test[:2])
  accuracy = test_accuracy(model.apply, params, dataset.x_test, dataset.y_test)
  return accuracy, graph.total_flops / 2


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='300 steps, one seed')
  args = parser.parse_args()
  steps, seeds = (300, [0]) if args.quick else (3000, [0, 1, 2])
  dataset = train_lib.load_digits()
  candidates = {
    'gradual (ChannelRule, 500 -> 2000, fine-tune to 3000)': lambda s: gradual(s, steps),
    'one-shot at 500 + fine-tune 2500': lambda s: one_shot(s, steps, steps // 6, dataset),
    'one-shot at 2000 + fine-tune 1000': lambda s: one_shot(s, steps, 2 * steps // 3, dataset),
    'small CNN (8-16/32) from scratch': lambda s: scratch(s, steps, dataset),
  }
  rows = []
  for name, run in candidates.items():
    accuracies, flops = [], set()
    for seed in seeds:
      accuracy, f = run(seed)
      accuracies.append(100 * accuracy)
      flops.add(round(f))
      print(f'{name}, seed {seed}: {accuracy:.2%}', flush=True)
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    rows.append(
      [
        name,
        ' / '.join(f'{a:.2f}' for a in accuracies),
        f'{statistics.mean(accuracies):.2f} ± {spread:.2f}',
        ', '.join(f'{f:,}' for f in sorted(flops)),
      ]
    )
  print(f'\n{steps} steps, seeds {seeds}, test split of {len(dataset.y_test)} images')
  print(table(['candidate', 'test accuracy % per seed', 'mean ± std', 'FLOPs per image'], rows))


if __name__ == '__main__':
  main()
