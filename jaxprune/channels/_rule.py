"""Gradual channel pruning: the mask rule that prunes whole coupled channels.

`ChannelRule(graph)` plugs into the optax transform (`jaxprune.pruning(hp,
mask_rule=rule)`). At each mask update, inside jit, it scores every channel of
every prunable group of `graph` by the L2 norm of everything the channel owns
(producer filter, bias, normalisation scale and bias, consumer rows, residual
partners: the score of `select(..., importance='l2')`), thresholds the scores
of each group (or of all groups at once) with the transform's own rules
(schedule, gating, histogram or exact threshold, decay: docs/explanation/semantics.md),
moves each group's kept count to one the `Constraint` allows, and masks every
slice of the removed channels. The masks stay a bool tree parallel to the
params, so the transform zeroes them as it zeroes single weights, and
`jaxprune.channels.shrink` then cuts them out (Zhu & Gupta 2017 schedule;
channel groups as in Torch-Pruning, Fang et al. 2023, arXiv 2301.12900).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxprune._config import hparams as hparams_lib
from jaxprune._masks import update as masks_lib
from jaxprune._names import named_leaves
from jaxprune._search.counting import WeightReader
from jaxprune.channels import _layout as layout_lib
from jaxprune.structured import Constraint, DependencyGraph

PyTree = Any
AUTO = 'auto'


def _home(group: layout_lib.Group) -> layout_lib.Slice:
  """The slice that tells a group's channel masks back from its leaf masks (k == 1 first)."""
  return min(group.slices, key=lambda s: s.indices.shape[1])


def channel_keeps_from_masks(
  layout: layout_lib.ChannelLayout, masks: Sequence[Any], xp: Any = jnp
) -> list[Any]:
  """Per group, the (size,) bool channel mask that leaf masks made by `leaf_masks` encode.

  A kept channel keeps some entry of each of its slices (no group is ever
  emptied, so every other axis keeps a position); a removed one keeps none.
  """
  keeps = []
  for group in layout.groups:
    home = _home(group)
    mask = masks[home.leaf]
    other = tuple(a for a in range(mask.ndim) if a != home.axis)
    along = xp.any(mask, axis=other) if other else mask
    keeps.append(xp.any(along[home.indices], axis=1))
  return keeps


def leaf_masks(layout: layout_lib.ChannelLayout, keeps: Sequence[Array]) -> list[Array]:
  """The bool mask of every pruned leaf from the groups' (size,) channel masks.

  An entry is kept when every channel owning one of its positions is kept.
  """
  per_leaf: list[list[Array]] = [[] for _ in layout.pruned]
  for group, keep in zip(layout.groups, keeps, strict=True):
    for piece in group.slices:
      vector = jnp.where(piece.owner >= 0, keep[np.maximum(piece.owner, 0)], True)
      shape = [1] * len(layout.shapes[layout.pruned[piece.leaf]])
      shape[piece.axis] = -1
      per_leaf[piece.leaf].append(vector.reshape(shape))
  masks = []
  for index, vectors in zip(layout.pruned, per_leaf, strict=True):
    mask = vectors[0]
    for vector in vectors[1:]:
      mask = mask & vector
    masks.append(jnp.broadcast_to(mask, layout.shapes[index]))
  return masks


def _scores(layout: layout_lib.ChannelLayout, values: Sequence[Array]) -> list[Array]:
  """Per group, (size,) float32: the L2 norm of all the slices each channel owns."""
  row_squares: dict[tuple[int, int], Array] = {}
  scores = []
  for group in layout.groups:
    total = jnp.zeros((group.size,), jnp.float32)
    for piece in group.slices:
      key = (piece.leaf, piece.axis)
      if key not in row_squares:
        w = values[piece.leaf].astype(jnp.float32)
        other = tuple(a for a in range(w.ndim) if a != piece.axis)
        row_squares[key] = jnp.sum(jnp.square(w), axis=other)
      total = total + jnp.sum(row_squares[key][piece.indices], axis=1)
    scores.append(jnp.sqrt(total))
  return scores


def _constrained(group: layout_lib.Group, mask: Array, score: Array) -> Array:
  """The threshold's channel mask moved to the nearest kept count the constraint allows.

  When the count must change, the channels kept are the highest scoring ones
  (the lower index first among equal scores).
  """
  count = jnp.sum(mask, dtype=jnp.int32)
  allowed = jnp.asarray(group.keeps)[count]
  order = jnp.argsort(-score, stable=True)
  rank = jnp.zeros((group.size,), jnp.int32).at[order].set(jnp.arange(group.size, dtype=jnp.int32))
  return jnp.where(allowed == count, mask, rank < allowed)


class ChannelRule:
  """The mask rule of gradual channel pruning: `jaxprune.pruning(hp, mask_rule=rule)`.

  The pruned leaves are the params that hold a channel of a prunable,
  unlocked group; each group's share of removed channels follows the
  schedule of `hp` (`target_sparsity` is the fraction of channels removed),
  with its gating, `threshold_method`, `nbins`, `threshold_decay` and
  `global_pruning` (one threshold over all groups, on scores divided by
  their group's mean as `select`'s global scope does). Block, N:M and
  per-leaf settings do not apply to channels and are refused.
  """

  def __init__(
    self, graph: DependencyGraph, *, constraint: Constraint | None = None, params: str | None = AUTO
  ):
    """Builds the rule's static tables.

    Args:
      graph: `jaxprune.structured.trace(fn, variables, *example_args)`.
      constraint: min channels, round_to and locked groups, as for `select`
        (default `Constraint(round_to=8)`); applied to each group's kept
        count after the threshold.
      params: the key of the variables the optimizer updates ('params' for
        Flax Linen), None when it updates the whole variables (a params
        dict, an NNX state); 'auto' picks 'params' when the variables have
        that collection.

    Raises:
      TypeError: for a constraint that is not a `Constraint`.
      ValueError: when `params` names no part of the variables.
    """
    if not isinstance(graph, DependencyGraph):
      raise TypeError(
        f'ChannelRule: graph must be a DependencyGraph from '
        f'jaxprune.structured.trace, got {type(graph).__name__}.'
      )
    if constraint is not None and not isinstance(constraint, Constraint):
      raise TypeError(
        f'ChannelRule: constraint must be a jaxprune.structured.Constraint, got '
        f'{type(constraint).__name__}.'
      )
    self.graph = graph
    self.constraint = constraint or Constraint(round_to=8)
    self.params_key = layout_lib.default_params_key(graph) if params == AUTO else params
    dtypes = {n: a.dtype for n, a in zip(graph.leaf_names, graph.variables_avals, strict=True)}
    self.layout = layout_lib.build(graph, self.params_key, self.constraint, dtypes)

  def check(self, hparams: hparams_lib.HParams) -> None:
    """ValueError naming the first hparams field that does not apply to channels: a map
    with entries, an N:M pattern, or a block shape or regex the user set (`HParams.given`),
    whatever its value."""
    refused = [
      (
        'weight_sparsity_map',
        hparams.sparsity_entries,
        'per-leaf targets do not apply to channel groups; lock groups with Constraint(locked=...)',
      ),
      ('block_dims_map', hparams.block_entries, 'channels are the blocks'),
      (
        'block_height/block_width',
        {'block_height', 'block_width'} & hparams.given,
        'channels are the blocks',
      ),
      ('nm_sparsity', hparams.nm is not None or hparams.nm_entries, 'N:M is a weight pattern'),
      ('layer_axes_map', hparams.layer_entries, 'stacked layers share their channel groups'),
      (
        'weight_name_regex',
        'weight_name_regex' in hparams.given,
        'the channel groups decide which leaves are pruned; lock groups with '
        'Constraint(locked=...)',
      ),
    ]
    for field, value, why in refused:
      if value:
        raise ValueError(
          f'{field} is set, but channel pruning (mask_rule=ChannelRule) masks '
          f'whole channels: {why}. Leave {field} at its default.'
        )

  def init(self, params: PyTree) -> tuple[PyTree, PyTree]:
    """All-True masks for the leaves that hold pruned channels (None elsewhere) and a
    zero threshold per group, `{group label: float32}`."""
    named = named_leaves(params)
    self.layout.check_params([n for n, _ in named], [tuple(jnp.shape(x)) for _, x in named])
    pruned = set(self.layout.pruned)
    leaves, treedef = jax.tree.flatten(params)
    masks = [jnp.ones(jnp.shape(x), bool) if i in pruned else None for i, x in enumerate(leaves)]
    thresholds = {g.label: jnp.zeros((), jnp.float32) for g in self.layout.groups}
    return jax.tree.unflatten(treedef, masks), thresholds

  def new_masks(
    self,
    hparams: hparams_lib.HParams,
    weights: list[WeightReader],
    old_masks: list[Array],
    thresholds: PyTree,
    sparsity: Array,
  ) -> tuple[list[Array], PyTree, Array]:
    """One mask update inside jit (see `jaxprune.MaskRule`)."""
    layout = self.layout
    if not layout.groups:
      return list(old_masks), thresholds, jnp.int32(0)
    scores = _scores(layout, [w() for w in weights])
    if hparams.global_pruning:
      # Mean-normalised, as select's global scope ranks groups of different scales.
      scores = [jnp.where(jnp.mean(s) > 0, s / jnp.mean(s), jnp.zeros_like(s)) for s in scores]
      sparsities = [jnp.reshape(sparsity, (1,))]
      previous = [jnp.reshape(thresholds[layout.groups[0].label], (1,))]
    else:
      sparsities = [jnp.full((1,), sparsity, jnp.float32) for _ in layout.groups]
      previous = [jnp.reshape(thresholds[g.label], (1,)) for g in layout.groups]
    units = [
      masks_lib.Variable(WeightReader.of(s), (g.size,))
      for g, s in zip(layout.groups, scores, strict=True)
    ]
    new_thresholds, channel_masks, nonfinite = masks_lib.update_masks(
      units,
      sparsities,
      previous,
      channel_keeps_from_masks(layout, old_masks),
      nbins=hparams.nbins,
      threshold_decay=hparams.threshold_decay,
      threshold_method=hparams.threshold_method,
      pooling='AVG',
      global_threshold=hparams.global_pruning,
      mask_search=hparams.mask_search,
    )
    keeps = [
      _constrained(g, m, s) for g, m, s in zip(layout.groups, channel_masks, scores, strict=True)
    ]
    by_group = {
      g.label: jnp.reshape(new_thresholds[0 if hparams.global_pruning else i], ())
      for i, g in enumerate(layout.groups)
    }
    return leaf_masks(layout, keeps), by_group, jnp.sum(nonfinite, dtype=jnp.int32)
