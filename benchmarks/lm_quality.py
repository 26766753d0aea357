"""How much held-out quality the main job's language model loses to gradual pruning.

Trains configs/lm.py (the byte-level decoder on the standard library's `.py`
files) dense, then pruned gradually to 50%, 75% and 90% of each layer of each
stacked kernel, all for the same number of steps on the same batches, with the
pruning transform's default mask source (TF's order: the weights after the
step) and with `mask_source='params'`, and prints the held-out bits per byte
of each beside the dense run's. The pruning schedule keeps the config's
proportions: dense for the first sixth of the steps, the cubic schedule to the
target by two thirds, then fine-tuning with the masks fixed.

    python -m benchmarks.lm_quality --steps 300            # the config's model
    python -m benchmarks.lm_quality --layers 2 --d_model 64 --seq_len 64 --steps 600
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import ml_collections

import jaxprune_train as train

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs/lm.py')


def lm_config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  """configs/lm.py at the sizes and steps of `args`, writing nothing."""
  spec = importlib.util.spec_from_file_location('lm_config', CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.num_steps = args.steps
  config.data.test_windows = args.test_windows
  config.data.seq_len = args.seq_len
  config.model.num_layers = args.layers
  config.model.d_model = args.d_model
  config.model.mlp_dim = 3 * args.d_model
  config.log_every = args.steps
  config.eval_every = args.steps
  config.progress_bar = False
  config.tensorboard = False
  config.plots = False
  return config


def run(args: argparse.Namespace, target: float | None, mask_source: str) -> dict:
  """One run: `target` None trains dense. Returns its row of the table."""
  config = lm_config(args)
  # configs/lm.py's proportions (100, 400 and 25 of 600 steps), the end on a mask update.
  begin = args.steps // 6
  frequency = max(1, (2 * args.steps // 3 - begin) // 12)
  end = begin + 12 * frequency
  if target is None:
    config.prune = False
  else:
    config.pruning = train.pruning_config(
      config.pruning,
      begin_pruning_step=begin,
      sparsity_function_begin_step=begin,
      end_pruning_step=end,
      sparsity_function_end_step=end,
      pruning_frequency=frequency,
      target_sparsity=target,
      mask_source=mask_source,
    )
  start = time.process_time()
  result = train.train(config)
  leaves = result.report.leaves
  size = sum(leaf.size for leaf in leaves)
  achieved = 1 - sum(leaf.nonzero for leaf in leaves) / size if leaves else 0.0
  return {
    'target': target,
    'mask_source': mask_source if target is not None else '-',
    'achieved': achieved,
    'bits_per_byte': result.report.bits_per_byte,
    'cpu_s': time.process_time() - start,
  }


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=300, help='training steps of every run')
  parser.add_argument('--test_windows', type=int, default=512, help='held-out windows')
  parser.add_argument('--layers', type=int, default=4, help='decoder layers')
  parser.add_argument('--d_model', type=int, default=128, help='model width (MLP 3x)')
  parser.add_argument('--seq_len', type=int, default=128, help='bytes per window')
  parser.add_argument('--targets', default='0.5,0.75,0.9', help='comma-separated sparsities')
  args = parser.parse_args(argv)
  targets = [float(t) for t in args.targets.split(',')]
  dense = run(args, None, 'updated')
  print(f'dense: {dense["bits_per_byte"]:.4f} bits/byte ({dense["cpu_s"]:.0f} CPU s)', flush=True)
  rows = [dense]
  for target in targets:
    for source in ('updated', 'params'):
      row = run(args, target, source)
      print(
        f'{target:.0%} {source}: {row["bits_per_byte"]:.4f} bits/byte ({row["cpu_s"]:.0f} CPU s)',
        flush=True,
      )
      rows.append(row)
  print()
  print('| target | mask_source | achieved | held-out bits/byte | vs dense |')
  print('|---|---|---|---|---|')
  for row in rows:
    target = 'dense' if row['target'] is None else f'{row["target"]:.0%}'
    ratio = row['bits_per_byte'] / dense['bits_per_byte']
    print(
      f'| {target} | {row["mask_source"]} | {row["achieved"]:.1%} | '
      f'{row["bits_per_byte"]:.4f} | {ratio:.3f}x |'
    )
  total = sum(row['cpu_s'] for row in rows)
  print(
    f'\n{args.layers} layers, d_model {args.d_model}, {args.seq_len}-byte windows, '
    f'{args.steps} steps per run; {total:.0f} CPU s in all (process time, all threads).'
  )


if __name__ == '__main__':
  main()
