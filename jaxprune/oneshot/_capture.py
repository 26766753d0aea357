"""Input statistics of chosen layers on calibration batches, one jitted pass per batch.

The model runs as traced (`jaxprune.structured._shared.evaluate_watching`, the
structured pass's interpreter); at each `dot_general` that reads a chosen
layer, its input `x` is flattened to `(tokens, input channels)` and reduced
on the spot, inside `jit`: to `sum x_j^2` per input channel (Wanda) or to the
Gram matrix `X^T X` (SparseGPT). Only these reductions leave the jitted
function, so a pass never holds more than XLA needs for them, and the work
after the last chosen layer is dead code XLA drops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune.oneshot._layers import Layer
from jaxprune.structured._shared import evaluate_watching


def _rows(x: jax.Array, contracting: Sequence[int]) -> jax.Array:
  """`x` as float32 `(tokens, K)`: contracted axes last, in order, then flattened."""
  x = jnp.moveaxis(jnp.asarray(x, jnp.float32), tuple(contracting),
                   tuple(range(x.ndim - len(contracting), x.ndim)))
  k = int(np.prod([x.shape[a] for a in range(x.ndim - len(contracting), x.ndim)]))
  return x.reshape(-1, k)


def _reduce(rows: jax.Array, kind: str) -> jax.Array:
  if kind == 'gram':
    return jnp.matmul(rows.T, rows, precision=jax.lax.Precision.HIGHEST)
  return jnp.sum(rows * rows, axis=0)


def stat_size(layers: Sequence[Layer], leaves: Sequence[Any], kind: str) -> int:
  """Floats the statistics of `layers` take."""
  inputs = [int(np.prod([leaves[layer.leaf].shape[a] for a in layer.in_axes])) for layer in layers]
  return sum(k * k if kind == 'gram' else k for k in inputs)


def collector(closed: Any, layers: Sequence[Layer], kind: str) -> Callable[..., dict]:
  """A function `(leaves, batches) -> {leaf: (sum of the reduction over the batches and
  sites, number of input rows)}` for `layers`, one jitted pass per batch.

  Args:
    closed: the ClosedJaxpr of `fn(params, batch)`.
    layers: the layers to measure.
    kind: 'gram' for `X^T X`, 'sqnorm' for the per-channel sum of squares.
  """
  by_site = {(site.scope, site.index): (layer.leaf, site) for layer in layers
             for site in layer.sites}

  @jax.jit
  def run(flat):
    found: dict[int, list[jax.Array]] = {}

    def watch(scope, index, eqn, invals, outs):
      del eqn, outs
      hit = by_site.get((scope, index))
      if hit is not None:
        leaf, site = hit
        found.setdefault(leaf, []).append(_rows(invals[site.operand], site.contracting))

    evaluate_watching(closed.jaxpr, closed.consts, flat, (), watch)
    return {leaf: (sum(_reduce(r, kind) for r in rows), sum(r.shape[0] for r in rows))
            for leaf, rows in found.items()}

  def collect(leaves: Sequence[Any], batches: Sequence[Any]) -> dict[int, tuple[Any, int]]:
    totals: dict[int, tuple[Any, int]] = {}
    for batch in batches:
      for leaf, (value, count) in run([*leaves, *jax.tree.leaves(batch)]).items():
        old, n = totals.get(leaf, (0.0, 0))
        totals[leaf] = (old + value, n + int(count))
    return totals

  return collect
