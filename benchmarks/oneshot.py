"""One-shot pruning of a byte-level LM trained on Python's standard library, and of a CNN.

Trains the model of `benchmarks/charlm.py` densely, and once more for the
same number of steps with gradual magnitude pruning to 50% (`jaxprune.pruning`,
Zhu & Gupta 2017, arXiv 1710.01878); then prunes the dense checkpoint once with
magnitude, Wanda and SparseGPT at 50% and 60% unstructured and at 2:4, and prints
held-out bits per character and the seconds each one-shot method takes.
The attention and MLP kernels of the blocks are pruned; the embedding and the
output head stay dense, as in the SparseGPT and Wanda papers. Wanda and
SparseGPT also prune the same checkpoint written with its blocks under one
`nn.scan` (`charlm.Config.scan`, the params stacked as MaxText holds them),
which must give the unrolled model's bits per character.

The `conv` command runs alone (under a minute on 2 CPU cores): it trains
the main job's digits CNN densely (`configs/digits_cnn.py` without pruning),
prunes its conv and dense kernels once with the same methods at 50%, 75% and
2:4, and prints test accuracy after pruning and after a short fine-tune with
the masks kept (`benchmarks/_oneshot_conv.py`).

    python -m benchmarks.oneshot train --workdir /tmp/oneshot   # two training runs
    python -m benchmarks.oneshot prune --workdir /tmp/oneshot   # one-shot, from dense
    python -m benchmarks.oneshot table --workdir /tmp/oneshot   # the Markdown table
    python -m benchmarks.oneshot conv                           # the digits CNN's table
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import ml_collections

import jaxprune
from benchmarks import _oneshot_conv, _timing, charlm
from jaxprune import oneshot

BLOCK_KERNELS = r'block_\d+/.*/kernel$'
CALIBRATION = dict(batch_size=16, count=8, seed=1)  # 16 x 8 x 128 = 16k bytes
HELDOUT = dict(batch_size=32, count=16)  # 64k held-out bytes


def gradual_hparams(steps: int) -> ml_collections.ConfigDict:
  """50% by step 0.7 * steps, from step 0.2 * steps, masks every 10 steps, exact thresholds
  (with the default histogram thresholds one run ended with block_0/down/kernel at 0%)."""
  begin, end = steps // 5, steps * 7 // 10
  return jaxprune.parse_hparams(
    f'target_sparsity=0.5,begin_pruning_step={begin},sparsity_function_begin_step={begin},'
    f'sparsity_function_end_step={end},pruning_frequency=10,threshold_method=exact,'
    f'weight_name_regex={BLOCK_KERNELS}'
  )


def train(workdir: str, steps: int, runs: tuple[str, ...] = ('dense', 'gradual')) -> None:
  os.makedirs(workdir, exist_ok=True)
  config = charlm.Config(steps=steps)
  data, heldout = charlm.load_split(config.heldout_every)
  evaluation = charlm.heldout_batches(heldout, seq_len=config.seq_len, **HELDOUT)
  results = {}
  if os.path.exists(os.path.join(workdir, 'train.json')):
    with open(os.path.join(workdir, 'train.json')) as f:
      results = json.load(f)
  for name, extra in (('dense', None), ('gradual', jaxprune.pruning(gradual_hparams(steps)))):
    if name not in runs:
      continue
    start = time.time()
    params, _ = charlm.train(config, data, extra=extra, log=lambda s, n=name: print(n, s))
    seconds = time.time() - start
    charlm.save(os.path.join(workdir, f'{name}.msgpack'), config, params)
    results[name] = {
      'bpc': charlm.bits_per_char(config, params, evaluation),
      'seconds': seconds,
      'sparsity': jaxprune.get_weight_sparsity(params),
    }
    print(name, results[name], flush=True)
    with open(os.path.join(workdir, 'train.json'), 'w') as f:
      json.dump(results, f, indent=1, default=float)


SETTINGS = {'50%': dict(sparsity=0.5), '60%': dict(sparsity=0.6), '2:4': dict(nm='2:4')}
VARIANTS = {
  'magnitude (per layer)': dict(method='magnitude'),
  'magnitude (per row)': dict(method='magnitude', per_row=True),
  'Wanda': dict(method='wanda'),
  'SparseGPT': dict(method='sparsegpt'),
}
SCANNED = ('Wanda', 'SparseGPT')  # also run on the model with its blocks under nn.scan
# The digits CNN: 75% instead of the LM's 60%, since 50% costs it next to nothing.
CONV_SETTINGS = {'50%': dict(sparsity=0.5), '75%': dict(sparsity=0.75), '2:4': dict(nm='2:4')}


def prune(workdir: str) -> None:
  """One-shot prunes the dense checkpoint every way; bits/char and seconds to prune.json."""
  config, dense = charlm.load(os.path.join(workdir, 'dense.msgpack'))
  data, heldout = charlm.load_split(config.heldout_every)
  evaluation = charlm.heldout_batches(heldout, seq_len=config.seq_len, **HELDOUT)
  calibration = [
    b[:, :-1]
    for b in charlm.sample_batches(
      data, CALIBRATION['batch_size'], config.seq_len, CALIBRATION['count'], CALIBRATION['seed']
    )
  ]
  scanned = dataclasses.replace(config, scan=True)
  models = {
    '': (config, dense),
    ', blocks under nn.scan': (scanned, charlm.stack_blocks(dense, config.layers)),
  }
  results = {'dense': charlm.bits_per_char(config, dense, evaluation)}
  for setting, target in SETTINGS.items():
    for suffix, (model_config, model_params) in models.items():
      fn = charlm.apply_fn(model_config)
      for name, method in VARIANTS.items():
        if suffix and name not in SCANNED:
          continue
        start = time.perf_counter()
        params, _ = oneshot.prune(
          fn, model_params, calibration, overrides={'^head/': None}, **method, **target
        )
        jax.block_until_ready(params)
        seconds = time.perf_counter() - start
        key = f'{name}{suffix} {setting}'
        results[key] = [charlm.bits_per_char(model_config, params, evaluation), seconds]
        print(f'{key}: {results[key]}', flush=True)
        with open(os.path.join(workdir, 'prune.json'), 'w') as f:
          json.dump(results, f, indent=1)


def table(workdir: str) -> None:
  """The Markdown table from train.json and prune.json."""
  config, _ = charlm.load(os.path.join(workdir, 'dense.msgpack'))
  with open(os.path.join(workdir, 'train.json')) as f:
    trained = json.load(f)
  with open(os.path.join(workdir, 'prune.json')) as f:
    pruned = json.load(f)
  rows = [['dense', *[f'{pruned["dense"]:.3f}'] * 3, '']]
  names = [*VARIANTS, *(f'{name}, blocks under nn.scan' for name in SCANNED)]
  rows += [
    [
      name,
      *[f'{pruned[f"{name} {s}"][0]:.3f}' for s in SETTINGS],
      ' / '.join(f'{pruned[f"{name} {s}"][1]:.0f}' for s in SETTINGS),
    ]
    for name in names
    if f'{name} 50%' in pruned
  ]
  gradual = trained['gradual']
  rows.append(
    [
      f'gradual magnitude in training ({config.steps} steps)',
      f'{gradual["bpc"]:.3f}',
      '',
      '',
      f'{gradual["seconds"]:.0f} (training)',
    ]
  )
  print(
    f'{config}; dense training {trained["dense"]["seconds"]:.0f} s; calibration '
    f'{CALIBRATION["count"]} x {CALIBRATION["batch_size"]} x {config.seq_len} bytes; '
    f'held-out {HELDOUT["count"] * HELDOUT["batch_size"] * config.seq_len} bytes\n'
  )
  print(
    _timing.table(['held-out bits/char', *SETTINGS, 'one-shot seconds (50% / 60% / 2:4)'], rows)
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('command', choices=['train', 'prune', 'table', 'conv'])
  parser.add_argument('--workdir', default='/tmp/jaxprune_oneshot')
  parser.add_argument('--steps', type=int, default=charlm.Config.steps)
  parser.add_argument('--runs', default='dense,gradual', help='train: which runs')
  parser.add_argument('--seeds', default='0,1,2', help='conv: the training seeds (mean)')
  parser.add_argument(
    '--finetune-steps',
    type=int,
    default=_oneshot_conv.FINETUNE_STEPS,
    help='conv: Adam steps of the fine-tune after pruning',
  )
  args = parser.parse_args()
  if args.command == 'train':
    train(args.workdir, args.steps, tuple(args.runs.split(',')))
  elif args.command == 'prune':
    prune(args.workdir)
  elif args.command == 'conv':
    seeds = tuple(int(seed) for seed in args.seeds.split(','))
    print(_oneshot_conv.table(seeds, VARIANTS, CONV_SETTINGS, args.finetune_steps))
  else:
    table(args.workdir)


if __name__ == '__main__':
  main()
