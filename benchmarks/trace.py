"""Time `jaxprune.structured.trace` on a ResNet-50-sized Flax model on CPU.

ResNet-50 (He et al. 2016): 53 convs, about 25.6M parameters, BatchNorm and
projection shortcuts. Goal: trace and group in under 5 seconds.

    python benchmarks/trace.py [--image 224] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp

import jaxprune.structured as structured

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')
)

from resnet50 import ResNet50  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--image', type=int, default=224)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  model = ResNet50()
  x = jnp.zeros((1, args.image, args.image, 3))
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  variables = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)
  n_params = sum(v.size for v in jax.tree.leaves(variables['params']))
  n_convs = sum(
    1
    for k in jax.tree_util.tree_flatten_with_path(variables['params'])[0]
    if 'Conv' in jax.tree_util.keystr(k[0]) and k[0][-1].key == 'kernel'
  )
  apply_train = functools.partial(model.apply, train=True, mutable=['batch_stats'])
  print(
    f'ResNet-50: {n_convs} convs, {n_params / 1e6:.1f}M params, input {tuple(x.shape)}, '
    f'CPU, best of {args.repeats}'
  )
  for label, fn in (('eval', model.apply), ('train, mutable batch_stats', apply_train)):
    trace_times, total_times = [], []
    for _ in range(args.repeats):
      start = time.perf_counter()
      jax.make_jaxpr(lambda v, x, fn=fn: fn(v, x))(variables, x)
      trace_times.append(time.perf_counter() - start)
      start = time.perf_counter()
      graph = structured.trace(fn, variables, x)
      total_times.append(time.perf_counter() - start)
    print(f'{label}: {graph.summary().splitlines()[0]}')
    print(
      f'  trace + group {min(total_times):.2f} s (goal < 5 s), of which '
      f'jax.make_jaxpr alone {min(trace_times):.2f} s'
    )


if __name__ == '__main__':
  main()
