"""Width through normalisations: which groups summed over by a norm stay exact.

With `trace(norms=...)` a `reduce_sum` over a channel axis (the mean of
LayerNorm, the mean square of RMSNorm) does not block it, so the residual
stream of a transformer (embeddings, every block's output projection, the
norms' scales and biases, the next layers' input rows, a tied LM head) is
one prunable group. What the pruned model computes there:

  'exact'        every sum runs over the kept channels and is divided by the
                 traced, full width (the pruned callable replays the traced
                 divisor). This equals the dense model with the removed
                 channels zeroed whenever the summed values are zero at the
                 removed channels: RMSNorm (x^2), and LayerNorm computed as
                 E[x^2] - E[x]^2 (Flax's default). A two-pass LayerNorm sums
                 (x - mean)^2, which is not zero there: such groups are
                 marked approximate.
  'renormalise'  every such sum is scaled by full / kept width, so a mean is
                 over the kept channels: a standard norm of the smaller
                 model, what a model rebuilt at the new width computes. The
                 statistics change, so every such group is approximate.

Which sums are zero at removed channels is measured, not guessed: the first
entry point runs once on its example inputs (random values stand in for
`ShapeDtypeStruct`s) with half of each such group's channels zeroed, and a
sum whose operand is not exactly zero at every zeroed position makes its
groups approximate. Sums inside loops, branches or other entry points are
not observed and count as approximate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._primitives import observe

MODES = ('exact', 'renormalise')


def check_mode(norms: Any) -> None:
  """Checks `trace`'s `norms` argument."""
  if norms is not None and norms not in MODES:
    raise ValueError(
      f'norms={norms!r}: use None (norms block the channels they sum over), '
      "'exact' (prune through them, keeping their full-width divisors) or "
      "'renormalise' (prune through them, dividing by the kept width)."
    )


def _value(x: Any, rng: np.random.Generator) -> Any:
  """A concrete array for a leaf or input: itself, or random values of its shape."""
  if not isinstance(x, jax.ShapeDtypeStruct):
    return x
  if jnp.issubdtype(x.dtype, jnp.floating):
    scale = 1.0 / np.sqrt(x.shape[-1]) if len(x.shape) > 1 else 1.0
    return jnp.asarray(rng.normal(scale=scale, size=x.shape), x.dtype)
  return jnp.zeros(x.shape, x.dtype)


def _zeroed(graph: DependencyGraph, leaves: Sequence[Any], removed: dict[int, np.ndarray]) -> list:
  """Leaves with the removed channels' positions set to zero (as `zero_removed`)."""
  out = []
  for name, leaf in zip(graph.leaf_names, leaves, strict=True):
    leaf = np.array(leaf)
    for axis, parts in graph.leaf_axes.get(name, {}).items():
      kept = graph.kept_positions(parts, leaf.shape[axis], removed)
      gone = np.setdiff1d(np.arange(leaf.shape[axis]), kept)
      index = [slice(None)] * leaf.ndim
      index[axis] = gone
      leaf[tuple(index)] = 0
    out.append(jnp.asarray(leaf))
  return out


def _parts(graph: DependencyGraph, reduction: tuple) -> list:
  scope, _, var, axis = reduction
  return graph.var_axes.get((scope, var), {}).get(axis, [])


def _observed_exact(
  graph: DependencyGraph, reductions: list, variables: Any, args: Sequence[Any], width: set[int]
) -> set[int]:
  """Groups all of whose sums (in the first entry point) sum exact zeros at removed channels."""
  rng = np.random.default_rng(0)
  removed = {
    gid: np.sort(rng.choice(graph.groups[gid].size, graph.groups[gid].size // 2, replace=False))
    for gid in width
  }
  leaves = [_value(x, rng) for x in jax.tree_util.tree_leaves(variables)]
  inputs = [_value(x, rng) for x in jax.tree_util.tree_leaves(tuple(args))]
  point = graph.entries[0]
  watched = {(r[0], r[1]) for r in reductions}
  operands = observe.collect(
    point.closed_jaxpr,
    [*_zeroed(graph, leaves, removed), *inputs],
    point.scope,
    lambda s, i, eqn, invals, outs: invals[0] if (s, i) in watched else None,
  )
  exact = set(width)
  for reduction in reductions:
    value = operands.get((reduction[0], reduction[1]))
    for part in _parts(graph, reduction):
      gone = part.indices[removed.get(part.group_id, np.zeros(0, np.int64))].ravel()
      if value is None or np.any(np.take(np.asarray(value), gone, axis=reduction[3]) != 0):
        exact.discard(part.group_id)
  return exact


def classify(
  graph: DependencyGraph, reductions: list, variables: Any, args: Sequence[Any]
) -> dict[int, bool]:
  """The groups the norms sum over (their kind is 'width'), and which are approximate.

  Args:
    graph: the DependencyGraph.
    reductions: the walker's `(scope, eqn index, operand, axis)` of each sum
      over a channel axis it let through.
    variables: the traced variables (arrays or `ShapeDtypeStruct`s).
    args: the first entry point's example arguments.

  Returns:
    `{group id: approximate}` for every prunable group a norm sums over.
  """
  width = {
    part.group_id
    for r in reductions
    for part in _parts(graph, r)
    if graph.groups[part.group_id].prunable
  }
  if not width:
    return {}
  # Scopes of entry point k > 0 start with -k (see `graph.VarKey`).
  first = [r for r in reductions if not r[0] or r[0][0] >= 0]
  others = [r for r in reductions if r not in first]
  exact = set()
  if graph.norms == 'exact':
    exact = _observed_exact(graph, first, variables, args, width)
    exact -= {part.group_id for r in others for part in _parts(graph, r)}
  return {gid: gid not in exact for gid in width}
