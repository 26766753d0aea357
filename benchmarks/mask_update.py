"""Mask-update cost on one tensor: jaxprune's histogram and exact rules vs a sort.

For float32 tensors of 1024x1024 and 4096x4096 at s = 0.9, times (interleaved,
median) of:
  * max(|w|)          one pass over the tensor: the memory-bandwidth floor;
  * histogram         jaxprune.update_mask, TF's histogram CDF rule;
  * exact             jaxprune.update_mask(threshold_method='exact');
  * sort top-k        threshold = sort(|w|)[N - k], mask = |w| >= threshold, the
                      way jaxpruner and tfmot compute a magnitude mask.
Also checks that the exact mask is bit-identical to the sort-based one.

Run: python benchmarks/mask_update.py
"""

from __future__ import annotations

import functools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

import jaxprune

try:
  from benchmarks._timing import interleaved, table
except ImportError:  # run as a script from the benchmarks folder
  from _timing import interleaved, table

SPARSITY = 0.9


@jax.jit
def max_pass(w):
  return jnp.max(jnp.abs(w))


@jax.jit
def histogram_mask(w):
  return jaxprune.update_mask(w, 0.0, SPARSITY)


@jax.jit
def exact_mask(w):
  return jaxprune.update_mask(w, 0.0, SPARSITY, threshold_method='exact')


def keep_count(size: int, sparsity: float) -> int:
  """tfmot's k = max(round(N * (1 - s)), 1) for the float32 s, in exact arithmetic, half to
  even (the weights the exact rule keeps)."""
  return max(round(size * (1 - Fraction(float(np.float32(sparsity))))), 1)


@jax.jit
def sort_mask(w):
  magnitudes = jnp.abs(w)
  kept = keep_count(w.size, SPARSITY)
  threshold = jnp.sort(magnitudes.ravel())[w.size - kept]
  return threshold, magnitudes >= threshold


def main() -> None:
  rows = []
  for side in (1024, 4096):
    w = jnp.asarray(np.random.default_rng(side).standard_normal((side, side), np.float32))
    same = bool(jnp.array_equal(exact_mask(w)[1], sort_mask(w)[1]))
    seconds = interleaved(
      {
        name: functools.partial(fn, w)
        for name, fn in (
          ('max', max_pass),
          ('histogram', histogram_mask),
          ('exact', exact_mask),
          ('sort', sort_mask),
        )
      },
      rounds=15,
      rounds_for={'sort': 3},
    )
    floor, sort = seconds['max'], seconds['sort']
    for name in ('max', 'histogram', 'exact', 'sort'):
      rows.append(
        [
          f'{side}x{side}',
          name,
          f'{seconds[name] * 1e3:.1f}',
          f'{seconds[name] / floor:.1f}x',
          f'{sort / seconds[name]:.0f}x',
          ('yes' if same else 'NO') if name == 'exact' else '',
        ]
      )
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}, sparsity {SPARSITY}')
  print(
    table(
      ['tensor', 'mask rule', 'ms', 'vs max pass', 'faster than sort', 'mask == sort mask'], rows
    )
  )


if __name__ == '__main__':
  main()
