"""The conv rows of benchmarks/oneshot.py: one-shot pruning of the main job's digits CNN.

The CNN of `configs/digits_cnn.py` (two 3x3 convs of 16 and 32 channels, a
64-wide dense layer, a 10-way head) is trained densely by the main job
(`jaxprune_train.train`, that config with `prune=False`: 3000 Adam steps), then
pruned once from calibration images of the training set with each method, and
fine-tuned for a few hundred Adam steps with the masks kept
(`jaxprune.apply_masks` after each step). Test accuracy (449 images) is printed
before and after the fine-tune, the dense model's (and the dense model's after
the same fine-tune) as the baseline.

`Conv_0` stays dense in every setting: it has one input channel, so no N:M
pattern with M > 1 can run along its input channels, and keeping it dense at
50% and 75% too makes every column prune the same layers (`Conv_1`, `Dense_0`
and the head `Dense_1`: 13,440 of the 13,584 kernel weights).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax

import jaxprune
import jaxprune_train as train_lib
from benchmarks import _timing
from jaxprune import oneshot

CONFIG = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'digits_cnn.py'
)
CALIBRATION = dict(batch_size=128, count=8, seed=1)  # 1,024 of the 1,348 training images
FINETUNE_STEPS = 300
DENSE = {'^Conv_0/': None}  # one input channel: see the docstring


def job_config(seed: int) -> Any:
  """`configs/digits_cnn.py` with pruning off and nothing written (the job's CNN, dense)."""
  spec = importlib.util.spec_from_file_location('_digits_cnn_config', CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.seed = seed
  config.prune = False
  config.progress_bar = config.tensorboard = config.plots = False
  config.log_every = config.eval_every = config.checkpoint_every = config.num_steps
  return config


def calibration(dataset: Any) -> list[np.ndarray]:
  """`count` batches of training images, drawn without replacement with a fixed seed."""
  size, count = CALIBRATION['batch_size'], CALIBRATION['count']
  order = np.random.default_rng(CALIBRATION['seed']).permutation(len(dataset.y_train))
  return [dataset.x_train[order[i * size : (i + 1) * size]] for i in range(count)]


class Task:
  """The job's model and data for one seed, its test accuracy and the masked fine-tune."""

  def __init__(self, config: Any):
    self.config = config
    self.dataset = train_lib.load_digits(
      seed=config.data.seed, test_fraction=config.data.test_fraction
    )
    self.model = train_lib.CNN(
      features=tuple(config.model.features),
      dense=config.model.dense,
      num_classes=self.dataset.num_classes,
    )
    self.tx = optax.adam(config.optimizer.learning_rate)
    self.logits = jax.jit(lambda p, x: self.model.apply({'params': p}, x))

    def loss(params, x, y):
      logits = self.model.apply({'params': params}, x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(params, opt_state, masks, x, y):
      grads = jax.grad(loss)(params, x, y)
      updates, opt_state = self.tx.update(grads, opt_state, params)
      # The pruned weights get Adam updates too; zeroing them after each step keeps the mask.
      return jaxprune.apply_masks(optax.apply_updates(params, updates), masks), opt_state

    self.step = jax.jit(step)

  def accuracy(self, params: Any) -> float:
    predicted = np.argmax(self.logits(params, self.dataset.x_test), axis=-1)
    return float(np.mean(predicted == self.dataset.y_test))

  def finetune(self, params: Any, masks: Any, steps: int) -> Any:
    """`steps` Adam steps from a fresh optimizer state, the batches of the job's batch size
    in an order fixed by the seed (the same for every method), the masks kept."""
    batch, n = self.config.batch_size, len(self.dataset.y_train)
    rng = np.random.default_rng((self.config.seed, 1))
    order = np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])
    opt_state = self.tx.init(params)
    for i in range(steps):
      idx = order[i * batch : (i + 1) * batch]
      params, opt_state = self.step(
        params, opt_state, masks, self.dataset.x_train[idx], self.dataset.y_train[idx]
      )
    return params


def _check_masked(params: Any, masks: Any, target: Mapping[str, Any]) -> None:
  """Every pruned weight is still zero, and each pruned kernel is at the target."""
  if 'nm' in target:
    n, m = map(int, target['nm'].split(':'))
    expected = 1 - n / m
  else:
    expected = target['sparsity']
  is_none = lambda x: x is None
  for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(masks, is_leaf=is_none), strict=True):
    if m is None:
      continue
    p, m = np.asarray(p), np.asarray(m)
    assert not np.any(p[~m]), 'a pruned weight came back in the fine-tune'
    assert abs((1 - m.mean()) - expected) < 1e-6, (target, 1 - m.mean())


def run_seed(
  seed: int, variants: Mapping[str, dict], settings: Mapping[str, dict], steps: int
) -> dict[str, list[float]]:
  """{row: [accuracy after pruning, after the fine-tune, one-shot seconds] per setting}."""
  config = job_config(seed)
  start = time.perf_counter()
  dense = train_lib.train(config).state.params
  print(f'seed {seed}: dense training {time.perf_counter() - start:.0f} s', flush=True)
  task = Task(config)
  batches = calibration(task.dataset)
  no_masks = jax.tree.map(lambda _: None, dense)
  dense_row = [task.accuracy(dense), task.accuracy(task.finetune(dense, no_masks, steps)), 0.0]
  results = {'dense': dense_row * len(settings)}
  for name, method in variants.items():
    results[name] = []
    for setting, target in settings.items():
      start = time.perf_counter()
      params, masks = oneshot.prune(task.model, dense, batches, overrides=DENSE, **method, **target)
      jax.block_until_ready(params)
      seconds = time.perf_counter() - start
      tuned = task.finetune(params, masks, steps)
      _check_masked(tuned, masks, target)
      results[name] += [task.accuracy(params), task.accuracy(tuned), seconds]
      print(f'seed {seed} {name} {setting}: {results[name][-3:]}', flush=True)
  return results


def table(
  seeds: tuple[int, ...],
  variants: Mapping[str, dict],
  settings: Mapping[str, dict],
  steps: int = FINETUNE_STEPS,
) -> str:
  """Runs every seed; the Markdown table of the mean test accuracies (%), and the seconds of
  each one-shot call of the first seed (with XLA compilation, as a single run pays it; the
  later seeds reuse the compiled code)."""
  runs = [run_seed(seed, variants, settings, steps) for seed in seeds]
  mean = lambda row, i: statistics.fmean(run[row][i] for run in runs)
  header = ['test accuracy (%)']
  for setting in settings:
    header += [setting, f'{setting} + fine-tune']
  header.append(f'one-shot seconds, seed {seeds[0]} ({" / ".join(settings)})')
  rows = []
  for row in runs[0]:
    cells = [row]
    for k in range(len(settings)):
      cells += [f'{100 * mean(row, 3 * k):.2f}', f'{100 * mean(row, 3 * k + 1):.2f}']
    cells.append(
      ''
      if row == 'dense'
      else ' / '.join(f'{runs[0][row][3 * k + 2]:.1f}' for k in range(len(settings)))
    )
    rows.append(cells)
  return (
    f'digits CNN of configs/digits_cnn.py, {len(seeds)} seed(s) {list(seeds)} (mean); '
    f'calibration {CALIBRATION["count"]} x {CALIBRATION["batch_size"]} training images; '
    f'fine-tune {steps} Adam steps, masks kept; Conv_0 dense\n\n' + _timing.table(header, rows)
  )
