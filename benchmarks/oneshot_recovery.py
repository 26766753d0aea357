"""Recovery: fine-tuning a one-shot pruned byte-level LM with its masks held.

Trains the 2-block model of `benchmarks/charlm.py` on Python's standard library (300
steps), prunes its attention and MLP kernels once with Wanda at 50% and at 2:4 (embedding
and output head dense), then fine-tunes each for K steps (AdamW at a tenth of the training
rate) with the masks held the documented way: `jaxprune.apply_masks(params, masks)` after
every update, so a pruned weight stays exactly zero. The dense model is fine-tuned the same
K steps, so each gap to dense compares models trained equally long. Held-out bits per byte
before and after, and the gap; its table is in docs/guides/oneshot.md. About 3 CPU minutes
on 2 cores.

    python -m benchmarks.oneshot_recovery --steps 150
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

import jaxprune
from benchmarks import _timing, charlm
from jaxprune import oneshot

PyTree = Any
CONFIG = charlm.Config(layers=2, steps=300)
CALIBRATION = dict(batch_size=16, count=4, seed=1)  # 16 x 4 x 128 = 8k bytes
HELDOUT = dict(batch_size=32, count=8)  # 32k held-out bytes
DENSE = {'^head/': None}  # the output head stays dense
RUNS = {
  'Wanda 50%': dict(method='wanda', sparsity=0.5),
  'Wanda 2:4': dict(method='wanda', nm='2:4'),
}


def finetune(
  config: charlm.Config,
  params: PyTree,
  masks: PyTree | None,
  batches: list[np.ndarray],
  learning_rate: float,
  log: Callable[[int, float], None] | None = None,
) -> PyTree:
  """AdamW on `batches` (one step each); with `masks`, `jaxprune.apply_masks` after every
  update holds them (a pruned weight stays exactly zero). Returns the new params."""
  fn = charlm.apply_fn(config)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate, weight_decay=0.01))
  state = tx.init(params)

  @jax.jit
  def step(params, state, batch):
    def loss(p):
      logits = fn(p, batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    if masks is not None:
      params = jaxprune.apply_masks(params, masks)
    return params, state, value

  for i, batch in enumerate(batches):
    params, state, value = step(params, state, batch)
    if log is not None:
      log(i, float(value))
  return params


def run(steps: int, seed: int = 0) -> tuple[list[list[str]], float]:
  """The table's rows and the CPU seconds the whole run took."""
  start = time.process_time()
  data, heldout = charlm.load_split(CONFIG.heldout_every)
  dense, _ = charlm.train(CONFIG, data, log=lambda _: None)
  evaluation = charlm.heldout_batches(heldout, seq_len=CONFIG.seq_len, **HELDOUT)
  calibration = [
    b[:, :-1]
    for b in charlm.sample_batches(
      data, CALIBRATION['batch_size'], CONFIG.seq_len, CALIBRATION['count'], CALIBRATION['seed']
    )
  ]
  # Fine-tuning batches drawn apart from training's (another seed).
  tuning = charlm.sample_batches(data, CONFIG.batch_size, CONFIG.seq_len, steps, seed + 100)
  learning_rate = CONFIG.learning_rate / 10
  bits = lambda p: charlm.bits_per_char(CONFIG, p, evaluation)
  before = {'dense': bits(dense)}
  after = {'dense': bits(finetune(CONFIG, dense, None, tuning, learning_rate))}
  fn = charlm.apply_fn(CONFIG)
  warnings.filterwarnings('ignore', message='oneshot.prune leaves 2 weight')  # embed, pos
  for name, options in RUNS.items():
    pruned, masks = oneshot.prune(fn, dense, calibration, overrides=DENSE, **options)
    before[name] = bits(pruned)
    tuned = finetune(CONFIG, pruned, masks, tuning, learning_rate)
    held = all(
      not np.any(np.asarray(p)[~np.asarray(m)])
      for p, m in zip(
        jax.tree.leaves(tuned), jax.tree.leaves(masks, is_leaf=lambda x: x is None), strict=True
      )
      if m is not None
    )
    after[name] = bits(tuned)
    print(f'{name}: {before[name]:.3f} -> {after[name]:.3f} bits/byte, masks held: {held}')
  rows = [
    [
      name,
      f'{before[name]:.3f}',
      f'{before[name] - before["dense"]:+.3f}',
      f'{after[name]:.3f}',
      f'{after[name] - after["dense"]:+.3f}',
    ]
    for name in before
  ]
  return rows, time.process_time() - start


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=150, help='fine-tuning steps K')
  args = parser.parse_args(argv)
  rows, seconds = run(args.steps)
  print(f'\n{seconds:.0f} CPU s in all (training {CONFIG.steps} steps, K = {args.steps})\n')
  print(
    _timing.table(
      [
        'model',
        'bits/byte, one-shot',
        'gap to dense',
        f'after {args.steps} steps, masks held',
        'gap to dense',
      ],
      rows,
    )
  )


if __name__ == '__main__':
  main()
