"""CPU speedup of structured pruning on third-party models, by `round_to`.

Each model comes from its own library (dm-haiku, equinox, transformers Flax,
keras 3; the builders of `tests/thirdparty_zoo*.py`, here at benchmark
sizes). 30% of the channels of every prunable group go (L2, uniform), with
the kept counts rounded to a multiple of `round_to` in {1 (none), 4, 8, 16};
the jitted dense model and the four pruned callables are timed interleaved
in one run, so load drift hits them alike. The table shows which rounding
CPU kernels like: odd channel counts can run slower than the dense model.
"speedup x FLOPs kept" is 1.0 when the time falls as the FLOPs do; rounding
also changes how many FLOPs go (small groups such as 6 or 8 heads cannot lose
any at round_to 8 or 16), so compare both. XLA's CPU convolutions are not
smooth in the channel count (a dense haiku ResNet-18 at width 64 ran 3.8x
slower than at width 60 in one interleaved run), so a speedup over a dense
model with power-of-two widths can exceed its FLOPs ratio.

Run: `python benchmarks/thirdparty.py` (`--quick` for a smoke run, `--models`
to pick).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings

import jax

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')
)

import thirdparty_zoo as zoo  # noqa: E402
import thirdparty_zoo_hf as hf  # noqa: E402

import jaxprune.structured as jps  # noqa: E402

try:
  from benchmarks._timing import interleaved, table
except ImportError:  # run as a script from the benchmarks folder
  from _timing import interleaved, table

RATIO = 0.3
ROUND_TO = (1, 4, 8, 16)

# name -> (builder at benchmark size, batch).
MODELS = {
  'haiku ResNet-18, 64x64': (functools.partial(zoo.haiku_resnet18, width=64, image=64), 16),
  'haiku MobileNetV1, 64x64': (
    functools.partial(
      zoo.haiku_mobilenet_v1,
      channels=(64, 128, 128, 256, 256, 512),
      strides=(1, 2, 1, 2, 1, 2),
      image=64,
    ),
    16,
  ),
  'equinox CNN 32-64-128, 32x32': (
    functools.partial(zoo.equinox_cnn, widths=(32, 64, 128), image=32),
    32,
  ),
  'HF ResNet-50, 64x64': (
    functools.partial(
      hf.hf_resnet, embedding=64, hidden_sizes=(256, 512, 1024, 2048), depths=(3, 4, 6, 3), image=64
    ),
    8,
  ),
  'HF RegNetY (48-104-208-440), 64x64': (
    functools.partial(
      hf.hf_regnet, embedding=32, hidden_sizes=(48, 104, 208, 440), depths=(1, 3, 6, 6), image=64
    ),
    8,
  ),
  'HF ViT-S/8, 64x64': (
    functools.partial(hf.hf_vit, hidden=384, layers=6, heads=6, image=64, patch=8),
    8,
  ),
  'HF BERT (4 layers, 512 wide), 128 tokens': (
    functools.partial(hf.hf_bert, hidden=512, layers=4, heads=8, length=128),
    8,
  ),
  'keras MobileNetV2, 96x96': (functools.partial(zoo.keras_mobilenet_v2, alpha=1.0, image=96), 16),
}


def bench(name: str, rounds: int) -> list[list[str]]:
  """Table rows for one model: FLOPs kept and times per `round_to`."""
  build, batch = MODELS[name]
  case = build()
  args = case.inputs(batch)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = jps.trace(case.fn, case.variables, *args)
  dense_flops = graph.total_flops
  candidates, flops = {'dense': functools.partial(jax.jit(case.fn), case.variables, *args)}, {}
  for round_to in ROUND_TO:
    plan = jps.select(
      graph, case.variables, ratio=RATIO, constraint=jps.Constraint(round_to=round_to)
    )
    new_variables, pruned_fn = jps.apply_plan(graph, case.variables, plan)
    candidates[round_to] = functools.partial(pruned_fn, new_variables, *args)
    flops[round_to] = jps.plan_flops(graph, plan) / dense_flops
  seconds = interleaved(candidates, rounds)
  dense_ms = 1e3 * seconds['dense']
  speedup = {r: seconds['dense'] / seconds[r] for r in ROUND_TO}
  return [
    [
      name,
      str(r),
      f'{flops[r]:.3f}',
      f'{dense_ms:.1f}',
      f'{1e3 * seconds[r]:.1f}',
      f'{speedup[r]:.2f}x',
      f'{speedup[r] * flops[r]:.2f}',
    ]
    for r in ROUND_TO
  ]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='3 timing rounds, first two models')
  parser.add_argument('--models', nargs='*', help='substrings of model names to run')
  args = parser.parse_args()
  names = list(MODELS)
  if args.models:
    names = [n for n in names if any(m.lower() in n.lower() for m in args.models)]
  if args.quick:
    names = names[:2]
  rounds = 3 if args.quick else 15
  print(
    f'jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; '
    f'{RATIO:.0%} of every group removed (L2, uniform), median of {rounds} interleaved calls'
  )
  header = [
    'model',
    'round_to',
    'FLOPs kept',
    'ms dense',
    'ms pruned',
    'speedup',
    'speedup x FLOPs kept',
  ]
  rows = []
  for name in names:
    rows += bench(name, rounds)
    print(table(header, rows[-len(ROUND_TO) :]), flush=True)
  print()
  print(table(header, rows))


if __name__ == '__main__':
  main()
