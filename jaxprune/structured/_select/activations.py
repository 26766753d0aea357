"""Activation importance: mean |activation| per channel on calibration batches.

Minitron (Muralidharan et al. 2024, arXiv 2407.14679) ranks a transformer's
embedding channels, heads and MLP units by the size of the activations they
carry rather than by their weights. Here every group is measured where a
weight reads it (`_trace/kinds.py`, "activation sites"): the width at the norms'
outputs entering q/k/v and the MLP, the MLP units entering the down
projection, the heads and the value/output head_dim entering the output
projection; a group no weight reads (q/k head_dim) where the projection
makes it. A channel's score is the mean |activation| over all other axes
(batch, tokens), summed over the positions it owns at every site, averaged
over the batches, then divided by the group's mean like the other criteria.
Groups with no site (none inside loops are seen) fall back to the L2 norm of
their weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.progress import progress_bar
from jaxprune.structured._core.shapes import same_avals
from jaxprune.structured._primitives import observe
from jaxprune.structured._select.importance import Scores, magnitude_importance, mean_normalised

PyTree = Any


def _wanted(graph: DependencyGraph) -> dict[tuple, set[tuple[int, int]]]:
  """`{(scope, eqn index): {(operand index or -1, axis)}}` of every site."""
  wanted: dict[tuple, set[tuple[int, int]]] = {}
  for sites in graph.activation_sites.values():
    for scope, index, operand, axis, _ in sites:
      wanted.setdefault((scope, index), set()).add((operand, axis))
  return wanted


def _mean_abs(value: Any, axis: int) -> jax.Array:
  """Mean |value| over every axis but `axis` -> shape (value.shape[axis],)."""
  value = jnp.abs(jnp.asarray(value, jnp.float32))
  others = tuple(a for a in range(value.ndim) if a != axis)
  return jnp.mean(value, axis=others) if others else value


def activation_importance(
  graph: DependencyGraph, variables: PyTree, batches: Iterable[Any], progress: bool = False
) -> Scores:
  """Mean |activation| per channel on calibration batches (see the module docstring).

  Args:
    graph: a DependencyGraph from `trace`.
    variables: the dense variables.
    batches: an iterable of the traced function's inputs, each a tuple of
      arguments (or one array for a one-argument function) at the shapes it
      was traced with.
    progress: show a tqdm progress bar.

  Returns:
    Mean-normalised scores per group.

  Raises:
    ValueError: for no batches, or a batch whose shapes are not the traced ones.
  """
  wanted = _wanted(graph)
  point = graph.entries[0]

  def pick(scope, index, eqn, invals, outs):
    del eqn
    sites = wanted.get((scope, index))
    if not sites:
      return None
    return {
      f'{operand}:{axis}': _mean_abs(outs[0] if operand < 0 else invals[operand], axis)
      for operand, axis in sites
    }

  leaves = jax.tree_util.tree_leaves(variables)
  if progress:
    batches = progress_bar(batches, 'activation importance')
  totals: dict[tuple, dict[str, np.ndarray]] = {}
  count = 0
  for batch in batches:
    args = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    flat = jax.tree_util.tree_leaves(args)
    if not same_avals(point.arg_avals, flat):
      shapes = ', '.join(f'{a.dtype}{list(a.shape)}' for a in point.arg_avals)
      raise ValueError(
        f'batches[{count}]: activation importance runs the traced function at '
        f'the shapes it was traced with ({shapes}); give batches of those '
        'shapes, or trace at the calibration batch shape.'
      )
    found = observe.collect(point.closed_jaxpr, [*leaves, *flat], point.scope, pick)
    for key, stats in found.items():
      into = totals.setdefault(key, {})
      for site, stat in stats.items():
        into[site] = into.get(site, 0.0) + np.asarray(stat, np.float64)
    count += 1
  if not count:
    raise ValueError('batches: activation importance needs at least one calibration batch.')
  fallback = magnitude_importance(graph, variables, p=2)
  scores = {}
  for group in graph.groups:
    sites = graph.activation_sites.get(group.id, [])
    total = np.zeros(group.size, np.float64)
    for scope, index, operand, axis, var in sites:
      stat = totals.get((scope, index), {}).get(f'{operand}:{axis}')
      if stat is None:
        continue
      for part in graph.var_axes.get((scope, var), {}).get(axis, ()):
        if part.group_id == group.id:
          total += stat[part.indices].sum(axis=1) / count
    scores[group.id] = mean_normalised(total) if sites else fallback[group.id]
  return scores
