"""OWL, DSnoT, RIA and channel permutation on a small byte-level LM, on a CPU budget.

Trains a 2-block version of the model of `benchmarks/charlm.py` on Python's standard library
(a few minutes on 2 CPU cores), then prunes its attention and MLP kernels once (embedding
and output head dense, as the papers do) and measures held-out bits per byte:

* magnitude, Wanda and SparseGPT at 50%, 60% and 70% unstructured, each alone, with OWL's
  layer-wise sparsities (`owl=True`: M = 5, lambda = 0.08; also per block as OWL's code does,
  `OWL(groups=BLOCKS)`) and with DSnoT's fix-up (`dsnot=True`); at 2:4 and 4:8 alone and
  with DSnoT;
* RIA at the same targets, at 2:4 and 4:8 also with its channel permutation
  (`permute=`: every N:M kernel except the attention output, whose inputs are a reshape of
  the heads);

and the outlier ratio OWL measures on each kernel (the share of Wanda scores above 5 times
their mean), which decides whether OWL can help. The whole run took about 6.5 CPU minutes
on 2 cores (56 s of training, 325 s for the 55 prunings and their evaluations); its table
and what it shows are in docs/guides/oneshot.md.

    python -m benchmarks.oneshot_lm run --workdir /tmp/oneshot_lm    # train, then prune
    python -m benchmarks.oneshot_lm table --workdir /tmp/oneshot_lm  # the Markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import jax
import numpy as np

from benchmarks import _timing, charlm
from jaxprune import oneshot

CONFIG = charlm.Config(layers=2, steps=300)
CALIBRATION = dict(batch_size=16, count=4, seed=1)  # 16 x 4 x 128 = 8k bytes
HELDOUT = dict(batch_size=32, count=8)  # 32k held-out bytes
DENSE = {'^head/': None}  # the output head stays dense
PERMUTE = r'/(q|k|v|gate|up|down)/kernel$'  # not 'o': its inputs are a reshape of the heads
BLOCKS = r'^block_\d+/'  # OWL(groups=...): a block's kernels share one ratio, as OWL's code
UNSTRUCTURED = ('50%', '60%', '70%')
NM = ('2:4', '4:8')


def runs() -> dict[str, tuple[str, dict]]:
  """Every pruning run: name -> (target, keyword arguments of `oneshot.prune`)."""
  out = {}
  for target in UNSTRUCTURED + NM:
    given = {'sparsity': int(target[:-1]) / 100} if target in UNSTRUCTURED else {'nm': target}
    for method in ('magnitude', 'wanda', 'sparsegpt', 'ria'):
      out[f'{method} {target}'] = (target, dict(method=method, **given))
      if method != 'ria':
        out[f'{method}+DSnoT {target}'] = (target, dict(method=method, dsnot=True, **given))
      if method != 'ria' and target in UNSTRUCTURED:
        out[f'{method}+OWL {target}'] = (target, dict(method=method, owl=True, **given))
        blocks = oneshot.OWL(groups=BLOCKS)
        out[f'{method}+OWL(blocks) {target}'] = (target, dict(method=method, owl=blocks, **given))
      if method == 'ria' and target in NM:
        out[f'ria+permute {target}'] = (target, dict(method=method, permute=PERMUTE, **given))
  return out


def run(workdir: str) -> None:
  """Trains the dense model (unless its checkpoint is there), then every pruning run."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'dense.msgpack')
  data, heldout = charlm.load_split(CONFIG.heldout_every)
  out = os.path.join(workdir, 'oneshot_lm.json')
  results: dict = {}
  if os.path.exists(out):  # go on from an earlier run: only the runs it lacks
    with open(out) as f:
      results = json.load(f)
  if os.path.exists(path):
    config, dense = charlm.load(path)
  else:
    start = time.process_time()
    dense, _ = charlm.train(CONFIG, data)
    config = CONFIG
    results['train_cpu_seconds'] = time.process_time() - start
    charlm.save(path, config, dense)
  evaluation = charlm.heldout_batches(heldout, seq_len=config.seq_len, **HELDOUT)
  calibration = [
    b[:, :-1]
    for b in charlm.sample_batches(
      data, CALIBRATION['batch_size'], config.seq_len, CALIBRATION['count'], CALIBRATION['seed']
    )
  ]
  fn = charlm.apply_fn(config)
  # The embedding and the positions are left dense on purpose; one warning says so per run.
  warnings.filterwarnings('ignore', message='oneshot.prune leaves 2 weight')
  results['dense'] = charlm.bits_per_char(config, dense, evaluation)
  start = time.process_time()
  _, _, report = oneshot.prune_with_report(
    fn, dense, calibration, method='wanda', sparsity=0.5, owl=True, overrides=DENSE
  )
  results['outliers'] = {layer.name: layer.outliers for layer in report.layers}
  results['owl_sparsity'] = {layer.name: layer.sparsity for layer in report.layers}
  for name, (_, kwargs) in runs().items():
    if name in results:
      continue
    begin = time.process_time()
    params, _ = oneshot.prune(fn, dense, calibration, overrides=DENSE, **kwargs)
    jax.block_until_ready(params)
    results[name] = [charlm.bits_per_char(config, params, evaluation), time.process_time() - begin]
    print(f'{name}: {results[name][0]:.3f} bits/byte, {results[name][1]:.1f} CPU s', flush=True)
  results['prune_cpu_seconds'] = results.get('prune_cpu_seconds', 0) + time.process_time() - start
  with open(out, 'w') as f:
    json.dump(results, f, indent=1)


def table(workdir: str) -> None:
  """The Markdown tables from oneshot_lm.json."""
  with open(os.path.join(workdir, 'oneshot_lm.json')) as f:
    results = json.load(f)
  targets = UNSTRUCTURED + NM
  rows = [['dense', *[f'{results["dense"]:.3f}'] * len(targets)]]
  names = []
  for method in ('magnitude', 'wanda', 'sparsegpt', 'ria'):
    names += [method] + [f'{method}+{x}' for x in ('OWL', 'OWL(blocks)', 'DSnoT', 'permute')]
  for name in names:
    keys = [f'{name} {t}' for t in targets]
    cells = [f'{results[k][0]:.3f}' if k in results else '' for k in keys]
    if any(cells):
      rows.append([name, *cells])
  ratios = np.array(list(results['outliers'].values()))
  print(
    f'training {results.get("train_cpu_seconds", float("nan")):.0f} CPU s, pruning '
    f'{results["prune_cpu_seconds"]:.0f} CPU s; outlier ratio (M = 5) over the kernels: mean '
    f'{ratios.mean():.2%}, min {ratios.min():.2%}, max {ratios.max():.2%}\n'
  )
  print(_timing.table(['held-out bits/byte', *targets], rows))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('command', choices=['run', 'table'])
  parser.add_argument('--workdir', default='/tmp/jaxprune_oneshot_lm')
  args = parser.parse_args()
  if args.command == 'run':
    run(args.workdir)
  else:
    table(args.workdir)


if __name__ == '__main__':
  main()
