"""OWL (Yin et al. 2023, arXiv 2310.05175, "Outlier Weighed Layerwise sparsity"): each layer's
share of the target sparsity, from the outliers of its Wanda scores.

A layer's outlier ratio `D_l` is the share of its scores `|W_ij| * ||X_j||_2` greater than `m`
times their mean. The ratios are scaled linearly to [0, 2 * lam] (`Dn_l`), and the layer's
sparsity is `target + c - Dn_l`: more outliers, lower sparsity, the layers spread over a range
of width 2 * lam. The official code (github.com/luuyin/OWL, `prune_wanda_outlier`) sets `c` to
the unweighted mean of `Dn`, so that the mean of the layers' sparsities is the target; here
`c` makes the mean weighted by each layer's weight count the target (the share of all weights
pruned), and each layer's count is a whole number, so that the model prunes exactly
`round(target * weights)` weights in all.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune.oneshot import _capture as capture
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot import _layer_prune as layer_prune
from jaxprune.oneshot._layers import Layer


@dataclasses.dataclass(frozen=True)
class OWL:
  """OWL's layer-wise sparsity (Yin et al. 2023, arXiv 2310.05175) for `oneshot.prune(owl=)`.

  Attributes:
    m: a score is an outlier when it exceeds `m` times its layer's mean score (the
      paper's M, `Hyper_m` in its code; 5 by default, as its LLaMA results use).
    lam: the layers' sparsities span `2 * lam` around the target (the paper's lambda,
      `Lamda`; 0.08 by default); in [0, min(target, 1 - target)].
  """

  m: float = 5.0
  lam: float = 0.08


def check(owl: OWL, target: float) -> None:
  """A ValueError for a bad `m` or a `lam` outside [0, min(target, 1 - target)]."""
  if isinstance(owl.m, bool) or not isinstance(owl.m, (int, float)) or not owl.m > 0:
    raise ValueError(f'owl.m={owl.m!r}: must be a number > 0, e.g. OWL(m=5).')
  high = min(target, 1.0 - target)
  if isinstance(owl.lam, bool) or not isinstance(owl.lam, (int, float)) or not 0 <= owl.lam <= high:
    raise ValueError(
      f'owl.lam={owl.lam!r}: must be in [0, min(sparsity, 1 - sparsity)] = [0, {high:g}] for '
      f'sparsity={target:g}; give e.g. OWL(lam={min(0.08, high):g}).'
    )


@functools.partial(jax.jit, static_argnames=('m',))
def outlier_ratio(w: jax.Array, sqnorm: jax.Array, *, m: float) -> jax.Array:
  """The share of `|W_ij| * ||X_j||_2` (w: (outputs, inputs), sqnorm: `||X_j||^2`, (inputs,)
  or (outputs, inputs)) greater than `m` times their mean."""
  scores = jnp.abs(w.astype(jnp.float32)) * jnp.sqrt(sqnorm)
  return jnp.mean(scores > m * jnp.mean(scores))


def sparsities(ratios: np.ndarray, sizes: np.ndarray, target: float, lam: float) -> np.ndarray:
  """Each layer's sparsity: `count_l / size_l`, the counts whole and adding up to
  `round(target * sum(sizes))`.

  Args:
    ratios: the layers' outlier ratios `D_l`.
    sizes: their weight counts.
    target: the sparsity of all of them together.
    lam: half the width of the range the sparsities span.

  Returns:
    float64 (layers,): `target + c - Dn_l`, `Dn` the ratios scaled to [0, 2 * lam] (all 0
    when the ratios are equal), `c` such that the weighted mean is `target`, each kept in
    [0, (size_l - 1) / size_l] (with `c` moved to make up for what that clips), then
    rounded to whole counts by largest remainder (ties: the earlier layer).
  """
  ratios, sizes = np.asarray(ratios, np.float64), np.asarray(sizes, np.float64)
  spread = ratios.max() - ratios.min()
  scaled = (ratios - ratios.min()) / spread * 2 * lam if spread > 0 else np.zeros_like(ratios)
  high = (sizes - 1) / sizes
  total = target * sizes.sum()

  def pruned(c):
    return np.sum(np.clip(target + c - scaled, 0.0, high) * sizes)

  # pruned(c) is nondecreasing in c: bisect for the shift that prunes `total`.
  lo, hi = -1.0 - 2 * lam, 1.0 + 2 * lam
  c = float(np.sum(scaled * sizes) / sizes.sum())
  if not np.isclose(pruned(c), total, rtol=0, atol=1e-9 * sizes.sum()):
    for _ in range(200):
      c = (lo + hi) / 2
      lo, hi = (c, hi) if pruned(c) < total else (lo, c)
  exact = np.clip(target + c - scaled, 0.0, high) * sizes
  counts = np.floor(exact + 1e-9)
  left = int(round(total)) - int(counts.sum())
  room = counts < sizes - 1
  order = [i for i in np.argsort(-(exact - counts), kind='stable') if room[i]]
  counts[order[:left]] += 1
  return counts / sizes


def allocate(
  closed: Any,
  layers: list[Layer],
  leaves: list[Any],
  batches: list[Any],
  target: float,
  owl: OWL,
) -> tuple[dict[tuple, tuple[float, None]], dict[tuple, float]]:
  """({layer key: its OWL target}, {layer key: its outlier ratio}) of `layers`, which
  share `target`."""
  ratios = outlier_ratios(closed, layers, leaves, batches, owl.m)
  sizes = [int(np.prod(layer_prune.matrix_shape(layer, leaves[layer.leaf]))) for layer in layers]
  keys = [inputs.layer_key(layer) for layer in layers]
  shares = sparsities(np.array([ratios[k] for k in keys]), np.array(sizes), target, owl.lam)
  return {k: (float(share), None) for k, share in zip(keys, shares, strict=True)}, ratios


def outlier_ratios(
  closed: Any, layers: list[Layer], leaves: list[Any], batches: list[Any], m: float
) -> dict[tuple, float]:
  """OWL's outlier ratio of each layer, from its inputs in the dense model (as OWL's code
  measures them, before anything is pruned)."""
  collect = capture.collector(closed, layers, ('sqnorm',))
  ratios = {}
  for part, at in capture.rounds(layers):
    stats = collect(leaves, batches, at)
    for layer in part:
      w = layer_prune.weight_matrix(layer, leaves[layer.leaf])
      sqnorm = jnp.repeat(stats[layer.leaf][0]['sqnorm'], w.shape[0] // layer.groups, axis=0)
      ratios[inputs.layer_key(layer)] = float(outlier_ratio(w, sqnorm, m=float(m)))
  return ratios
