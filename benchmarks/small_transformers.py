"""Why 30% of a small transformer does not pay on CPU: dense vs pruned time.

A 2-layer pre-LN transformer (Flax Linen) of width 64, 128 and 256 (4 heads,
MLP 4x width) has its heads, head_dim and MLP units pruned
by 30% (L2, uniform, `round_to` 1 and 8), at batch 1 x 16 tokens and 8 x 64
tokens; the jitted dense model and the
pruned callable are timed interleaved on CPU, median of `--rounds` calls.

    python benchmarks/small_transformers.py
"""

from __future__ import annotations

import argparse
import warnings

import flax.linen as nn
import jax

import jaxprune.structured as jps
from benchmarks._timing import interleaved, table


class Layer(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
    y = nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x)))
    return x + nn.Dense(self.width)(y)


class Transformer(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    for _ in range(2):
      x = Layer(self.width)(x)
    return x


def bench(width: int, batch: int, tokens: int, rounds: int) -> list[str]:
  model = Transformer(width)
  x = jax.random.normal(jax.random.key(1), (batch, tokens, width))
  variables = model.init(jax.random.key(0), x)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = jps.trace(model.apply, variables, x)
  dense_fn = jax.jit(model.apply)
  dense = graph.total_flops
  row = [f'{width}, {batch} x {tokens} tokens']
  candidates = {'dense': lambda: dense_fn(variables, x)}
  for round_to in (1, 8):
    plan = jps.select(graph, variables, ratio=0.3, constraint=jps.Constraint(round_to=round_to))
    new, pruned_fn = jps.apply_plan(graph, variables, plan)
    row.append(f'{jps.plan_flops(graph, plan) / dense:.2f}')
    candidates[round_to] = lambda new=new, fn=pruned_fn: fn(new, x)
  times = interleaved(candidates, rounds)
  row += [f'{times["dense"] * 1e3:.2f}'] + [f'{times["dense"] / times[r]:.2f}x' for r in (1, 8)]
  return row


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=20)
  args = parser.parse_args()
  rows = [
    bench(width, batch, tokens, args.rounds)
    for batch, tokens in ((1, 16), (8, 64))
    for width in (64, 128, 256)
  ]
  print(
    table(
      [
        'width, input',
        'FLOPs kept, round_to 1',
        'FLOPs kept, round_to 8',
        'ms dense',
        'speedup, round_to 1',
        'speedup, round_to 8',
      ],
      rows,
    )
  )


if __name__ == '__main__':
  main()
