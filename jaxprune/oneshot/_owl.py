"""OWL (Yin et al. 2023, arXiv 2310.05175, "Outlier Weighed Layerwise sparsity"): each layer's
share of the target sparsity, from the outliers of its Wanda scores.

A layer's outlier ratio `D_l` is the share of its scores `|W_ij| * ||X_j||_2` greater than `m`
times their mean. The ratios are scaled linearly to [0, 2 * lam] (`Dn_l`), and the layer's
sparsity is `target + c - Dn_l`: more outliers, lower sparsity, the layers spread over a range
of width 2 * lam. The official code (github.com/luuyin/OWL, `prune_wanda_outlier`) sets `c` to
the unweighted mean of `Dn`, so that the mean of the layers' sparsities is the target; here
`c` makes the mean weighted by each layer's weight count the target (the share of all weights
pruned), and each layer's count is a whole number, so that the model prunes exactly
`round(target * weights)` weights in all. OWL's code takes a decoder block's linear layers
together as one "layer" (one ratio from their scores together, one sparsity); here each
weight matrix is one, unless `OWL(groups=regex)` groups them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._config import maps as maps
from jaxprune.oneshot import _capture as capture
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot import _layer_prune as layer_prune
from jaxprune.oneshot._layers import Layer


@dataclasses.dataclass(frozen=True)
class OWL:
  r"""OWL's layer-wise sparsity (Yin et al. 2023, arXiv 2310.05175) for `oneshot.prune(owl=)`.

  Attributes:
    m: a score is an outlier when it exceeds `m` times its layer's mean score (the
      paper's M, `Hyper_m` in its code; 5 by default, as its LLaMA results use).
    lam: the layers' sparsities span `2 * lam` around the target (the paper's lambda,
      `Lamda`; 0.08 by default); in [0, min(target, 1 - target)].
    groups: None (each layer has its own ratio and sparsity), or a regex: the layers
      whose names give the same match (`re.search(groups, name).group(0)`, e.g.
      `r'^block_\d+/'` for the blocks of a transformer) share one ratio, from their scores
      together, and one sparsity, as OWL's code treats a decoder block's linear layers; a
      layer it does not match is a group of its own.
  """

  m: float = 5.0
  lam: float = 0.08
  groups: str | None = None


def check(owl: OWL, target: float) -> None:
  """A ValueError for a bad `m` or a `lam` outside [0, min(target, 1 - target)]."""
  if isinstance(owl.m, bool) or not isinstance(owl.m, (int, float)) or not owl.m > 0:
    raise ValueError(f'owl.m={owl.m!r}: must be a number > 0, e.g. OWL(m=5).')
  if owl.groups is not None:
    if not isinstance(owl.groups, str):
      raise ValueError(
        f"owl.groups={owl.groups!r}: give a regex, e.g. OWL(groups=r'^block_\\d+/')."
      )
    maps.check_regex('owl.groups', owl.groups)
  high = min(target, 1.0 - target)
  if isinstance(owl.lam, bool) or not isinstance(owl.lam, (int, float)) or not 0 <= owl.lam <= high:
    raise ValueError(
      f'owl.lam={owl.lam!r}: must be in [0, min(sparsity, 1 - sparsity)] = [0, {high:g}] for '
      f'sparsity={target:g}; give e.g. OWL(lam={min(0.08, high):g}).'
    )


@jax.jit
def score_sum(w: jax.Array, sqnorm: jax.Array) -> jax.Array:
  """The sum of the Wanda scores `|W_ij| * ||X_j||_2` (w: (outputs, inputs), sqnorm:
  `||X_j||^2` per row, (outputs, inputs))."""
  return jnp.sum(jnp.abs(w.astype(jnp.float32)) * jnp.sqrt(sqnorm))


@jax.jit
def count_above(w: jax.Array, sqnorm: jax.Array, threshold: jax.Array) -> jax.Array:
  """How many Wanda scores exceed `threshold`."""
  return jnp.sum(jnp.abs(w.astype(jnp.float32)) * jnp.sqrt(sqnorm) > threshold)


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
  """({layer key: its OWL target}, {layer key: its (group's) outlier ratio}) of `layers`,
  which share `target`."""
  sqnorms = _input_norms(closed, layers, leaves, batches)
  keys = [inputs.layer_key(layer) for layer in layers]
  weights = {
    k: layer_prune.weight_matrix(layer, leaves[layer.leaf])
    for k, layer in zip(keys, layers, strict=True)
  }
  sizes = {k: int(np.prod(weights[k].shape)) for k in keys}
  members: dict[str, list[tuple]] = {}
  for k, layer in zip(keys, layers, strict=True):
    found = re.search(owl.groups, layer.name) if owl.groups is not None else None
    members.setdefault(found.group(0) if found else layer.name, []).append(k)
  ratios, group_sizes = [], []
  for group in members.values():
    total = sum(sizes[k] for k in group)
    mean = sum(float(score_sum(weights[k], sqnorms[k])) for k in group) / total
    threshold = jnp.float32(owl.m * mean)
    above = sum(int(count_above(weights[k], sqnorms[k], threshold)) for k in group)
    ratios.append(above / total)
    group_sizes.append(total)
  shares = sparsities(np.array(ratios), np.array(group_sizes), target, owl.lam)
  targets, outliers = {}, {}
  for group, share, ratio, total in zip(members.values(), shares, ratios, group_sizes, strict=True):
    counts = _split(round(share * total), [sizes[k] for k in group])
    for k, count in zip(group, counts, strict=True):
      targets[k] = (count / sizes[k], None)
      outliers[k] = ratio
  return targets, outliers


def _split(count: int, sizes: list[int]) -> list[int]:
  """`count` shared among layers in proportion to their sizes: floors, then one more for
  the largest remainders (ties: the earlier layer)."""
  total = sum(sizes)
  exact = [count * n / total for n in sizes]
  out = [int(np.floor(x + 1e-9)) for x in exact]
  order = np.argsort([-(x - c) for x, c in zip(exact, out, strict=True)], kind='stable')
  for i in order[: count - sum(out)]:
    out[i] += 1
  return out


def _input_norms(
  closed: Any, layers: list[Layer], leaves: list[Any], batches: list[Any]
) -> dict[tuple, jax.Array]:
  """`||X_j||^2` of each layer's inputs per output row (outputs, inputs), in the dense
  model (as OWL's code measures them, before anything is pruned)."""
  collect = capture.collector(closed, layers, ('sqnorm',))
  out = {}
  for part, at in capture.rounds(layers):
    stats = collect(leaves, batches, at)
    for layer in part:
      rows = layer_prune.matrix_shape(layer, leaves[layer.leaf])[0]
      sqnorm = stats[layer.leaf][0]['sqnorm']
      out[inputs.layer_key(layer)] = jnp.repeat(sqnorm, rows // layer.groups, axis=0)
  return out
