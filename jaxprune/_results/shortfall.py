"""The warning of `summaries` for leaves a mask update left far below their target.

The histogram threshold is a multiple of max|w| / nbins: one outlier weight puts
nearly every other weight in the lowest bin, and then nothing is pruned (TF's rule
does the same). Each layer of a stacked leaf (`layer_axes_map`) has its own target
and is held to it; with `global_pruning` the target is that of all pruned leaves
together. A leaf is short when it is further below its target than rounding to
whole weights (or blocks) allows.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune._config import hparams as hparams_lib
from jaxprune._config import maps as maps
from jaxprune._config import schedule as schedule
from jaxprune._config.specs import resolve_block_dims

# A leaf this far below its target after a mask update is reported: the histogram
# rule may fall short by one bin's share, never by this much on ordinary weights.
SHORTFALL = 0.1


def shortfall_message(h: hparams_lib.HParams, step: int, short: list[str]) -> str:
  """The warning for leaves left far below their target by the mask update at `step`,
  with the likely causes and the remedy for the rule `h` uses."""
  causes = (
    'their weights were all zero (or subnormal, below 1.2e-38, which XLA on CPU reads '
    'as zero; init warns about those), or held NaN or Inf, at the update (such a leaf '
    'keeps its mask; see nonfinite_skips), or many of them were tied: weights equal to '
    'the threshold are kept together, so all-equal weights keep every one (initialise '
    'them at random, or prune after some training steps)'
  )
  if h.threshold_method == 'histogram':
    causes = (
      f'Either a few large weights put nearly all the others in the lowest of the '
      f"histogram's {h.nbins} bins (threshold_method='exact' keeps exactly the "
      f"target's share; more bins help too), or {causes}"
    )
  else:
    causes = causes[0].upper() + causes[1:]
  if h.block_dims != (1, 1) or h.block_entries:
    causes += ', or a leaf has too few blocks to come closer (it is pruned a block at a time)'
  return (
    f'jaxprune: after the mask update at step {step}, these leaves are far below their '
    f'target sparsity: {", ".join(short)}. {causes}.'
  )


def is_short(achieved: float, wanted: float, units: int) -> bool:
  """Whether `achieved` is more than SHORTFALL below the closest sparsity at or under
  `wanted` that `units` prunable units (weights or blocks) can reach: k / units."""
  closest = math.floor(wanted * units + 1e-6) / units
  return closest - achieved > SHORTFALL


def _layers(
  name: str, mask: Any, threshold: Any, dims: tuple[int, int], at: tuple[int, ...] = ()
) -> list[tuple]:
  """(label, sparsity, prunable units, weights) of each layer of a leaf: one for a plain
  leaf, one per entry of its threshold for a stacked one (`name[3]`). The layer axes are
  the leading ones, or the axes `at` (`layer_axes_map`'s '@' form). The shares are
  reduced where the mask lives; only one number per layer comes to the host."""
  shape = tuple(jnp.shape(mask))
  layer_axes = np.ndim(threshold)
  if not at and shape[:layer_axes] != tuple(np.shape(threshold)):
    layer_axes = 0  # layer axes elsewhere, unknown without hparams: the leaf as a whole
  at = at or tuple(range(layer_axes))
  layer_shape = tuple(d for i, d in enumerate(shape) if i not in at)
  size = max(1, math.prod(layer_shape))
  block = resolve_block_dims(layer_shape, dims) or (1, 1)
  units = max(1, size // math.prod(block))
  rest = tuple(i for i in range(len(shape)) if i not in at)
  pruned = jnp.sum(~mask, axis=rest, dtype=jnp.int32)
  per_layer = np.asarray(pruned).reshape(-1) / size
  if layer_axes == 0:
    return [(name, float(per_layer[0]), units, size)]
  indices = np.ndindex(*(shape[i] for i in at))
  return [
    (f'{name}[{", ".join(map(str, index))}]', float(value), units, size)
    for index, value in zip(indices, per_layer, strict=True)
  ]


def warn_short(state: Any, hparams: Any, masks: dict[str, Any], thresholds: dict[str, Any]) -> None:
  """Warns, naming the leaves (or layers), when a mask update left them far below target.

  Without `hparams` the per-leaf targets are not known (a map may lower any leaf), so it
  warns only when every pruned layer is far below the global target of the last step.
  Quiet under `jit`, before the first mask update, for N:M leaves and mask rules (no
  per-leaf target), and with a threshold decay (the masks then lag the schedule by
  design).
  """
  h = hparams_lib.HParams() if hparams is None else hparams_lib.freeze(hparams)
  if h.nm is not None or h.threshold_decay:
    return
  try:
    last = int(state.last_update_step)
  except (TypeError, RuntimeError):  # a tracer, or not addressable from this process
    return
  names = [name for name in thresholds if name in masks]  # a mask rule's are not leaves
  if last == 0 or not names:
    return
  nm_leaves, _ = maps.match_entries('nm_sparsity_map', names, h.nm_entries)
  targets, _ = maps.match_entries('weight_sparsity_map', names, h.sparsity_entries)
  dims, _ = maps.match_entries('block_dims_map', names, h.block_entries)
  at = _layer_indices(names, masks, h)
  try:
    layers = {
      name: _layers(
        name, masks[name], thresholds[name], dims.get(name) or h.block_dims, at.get(name, ())
      )
      for name in names
      if name not in nm_leaves
    }
  except RuntimeError:  # shares not addressable from this process: nothing to say here
    return
  if h.global_pruning and hparams is not None:
    short = _short_together(layers, float(schedule.sparsity_at(h, last)))
  else:
    wanted = {
      name: float(state.sparsity)
      if hparams is None
      else float(schedule.sparsity_at(h, last, target=targets.get(name, h.target_sparsity)))
      for name in layers
    }
    every = [(label, a, u, wanted[n]) for n, leaf in layers.items() for label, a, u, _ in leaf]
    short = [f'{label} {a:.1%} (target {w:.1%})' for label, a, u, w in every if is_short(a, w, u)]
    if hparams is None and len(short) < len(every):
      short = []  # some layer reached the global target: the others may have lower ones
  if short:
    warnings_lib.warn(shortfall_message(h, last, short))


def _layer_indices(
  names: list[str], masks: dict[str, Any], h: hparams_lib.HParams
) -> dict[str, tuple[int, ...]]:
  """The layer axes' indices of the leaves `layer_axes_map` names by index ('@'), ascending.
  Without hparams none are known, and a leaf's threshold axes are taken as leading."""
  entries, _ = maps.match_entries('layer_axes_map', names, h.layer_entries)
  at = {}
  for name, entry in entries.items():
    if not isinstance(entry, int):
      ndim = len(jnp.shape(masks[name]))
      at[name] = tuple(sorted(index % ndim for index in entry))
  return at


def _short_together(layers: dict[str, list[tuple]], wanted: float) -> list[str]:
  """global_pruning: the pruned leaves together against the target, each named."""
  every = [layer for leaf in layers.values() for layer in leaf]
  size = sum(n for *_, n in every)
  achieved = sum(a * n for _, a, _, n in every) / size
  if not is_short(achieved, wanted, sum(u for _, _, u, _ in every)):
    return []
  each = ', '.join(f'{label} {a:.1%}' for label, a, *_ in every)
  together = f'all pruned leaves together (global_pruning) {achieved:.1%}'
  return [f'{together} (target {wanted:.1%}): {each}']
