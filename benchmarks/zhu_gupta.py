"""Zhu & Gupta's check on digits: large-sparse vs small-dense at equal nonzeros.

"To prune, or not to prune" (Zhu & Gupta 2017, arXiv:1710.01878) found that a
large model pruned gradually beats a small dense model with the same number of
nonzero weights, and that gradual pruning stays close to the dense model. This
script measures, on scikit-learn's digits with the default 300-100 MLP and
three seeds each, the test accuracy of:

  * the dense 300-100 MLP;
  * gradual pruning to 90% and to 95% (the default config's schedule);
  * gradual pruning to 90% with `mask_source='params'` (the memory option: thresholds of
    the params one step older than TF's order);
  * one-shot magnitude pruning of the dense MLP to 90%, with no retraining;
  * a small dense MLP with as many parameters as the 90%-sparse one has nonzeros.

    python benchmarks/zhu_gupta.py            # about a minute on two CPU cores
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags

import jaxprune
import jaxprune_train as train_lib

try:
  from benchmarks._common import test_accuracy
except ImportError:  # run as a script from the benchmarks folder
  from _common import test_accuracy

_SEEDS = flags.DEFINE_integer('seeds', 3, 'Number of seeds per variant.')


def mlp_params(widths: Sequence[int], inputs: int = 64, classes: int = 10) -> int:
  """Number of parameters (kernels and biases) of an MLP."""
  sizes = [inputs, *widths, classes]
  return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def small_widths(budget: int) -> tuple[int, int]:
  """Hidden widths in the 300:100 ratio whose parameter count is nearest `budget`."""
  candidates = [(w, max(round(w / 3), 1)) for w in range(3, 301)]
  return min(candidates, key=lambda widths: abs(mlp_params(widths) - budget))


def one_shot(params: dict, sparsity: float) -> dict:
  """Zeroes the smallest-magnitude fraction `sparsity` of each kernel, no retraining."""

  def prune(path, leaf):
    if jaxprune.leaf_name(path).endswith('kernel'):
      _, mask = jaxprune.update_mask(leaf, jnp.float32(0), sparsity, threshold_method='exact')
      return jnp.where(mask, leaf, 0)
    return leaf

  return jax.tree_util.tree_map_with_path(prune, params)


def _config(seed: int, **changes) -> ml_collections.ConfigDict:
  config = train_lib.get_config()
  config.seed = seed
  config.progress_bar = False
  config.eval_every = config.num_steps
  for key, value in changes.items():
    if key in ('target_sparsity', 'mask_source'):
      config.pruning = train_lib.pruning_config(config.pruning, **{key: value})
    elif key == 'features':
      config.model.features = value
    else:
      config[key] = value
  return config


def main(argv: Sequence[str]) -> None:
  del argv
  dataset = train_lib.load_digits()
  results: dict[str, list[float]] = {}
  nonzeros: dict[str, int] = {}

  def record(name: str, accuracy: float, nonzero: int) -> None:
    results.setdefault(name, []).append(accuracy)
    nonzeros[name] = nonzero

  small = None
  for seed in range(_SEEDS.value):
    dense = train_lib.train(_config(seed, prune=False))
    record('dense 300-100', dense.report.final_accuracy, dense.report.total_nonzero)
    pruned = one_shot(dense.state.params, 0.9)
    nonzero = sum(int(jnp.count_nonzero(x)) for x in jax.tree.leaves(pruned))
    record(
      'one-shot 90%, no retraining',
      test_accuracy(train_lib.MLP().apply, pruned, dataset.x_test, dataset.y_test),
      nonzero,
    )
    for target in (0.9, 0.95):
      sparse = train_lib.train(_config(seed, target_sparsity=target))
      record(f'gradual to {target:.0%}', sparse.report.final_accuracy, sparse.report.total_nonzero)
      if target == 0.9:
        small = small or small_widths(sparse.report.total_nonzero)
        older = train_lib.train(_config(seed, target_sparsity=target, mask_source='params'))
        record(
          "gradual to 90%, mask_source='params'",
          older.report.final_accuracy,
          older.report.total_nonzero,
        )
    small_run = train_lib.train(_config(seed, prune=False, features=small))
    record(
      f'small dense {small[0]}-{small[1]}',
      small_run.report.final_accuracy,
      small_run.report.total_nonzero,
    )
    print(f'seed {seed} done', flush=True)

  print(
    f'\nTest accuracy on digits (449 test images), {_SEEDS.value} seeds, '
    f'{train_lib.get_config().num_steps} steps each:\n'
  )
  width = max(map(len, results))
  print(f'{"model":<{width}}  nonzero params  mean acc  std     per seed')
  for name, accuracies in results.items():
    std = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    seeds = ' '.join(f'{a:.4f}' for a in accuracies)
    print(
      f'{name:<{width}}  {nonzeros[name]:>14,}  {statistics.mean(accuracies):.4f}'
      f'    {std:.4f}  {seeds}'
    )


if __name__ == '__main__':
  app.run(main)
