"""Applies a plan: smaller variables and the pruned callable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import names
from jaxprune.structured.interpret import Shrinker, eval_jaxpr
from jaxprune.structured.plan import Plan, make_plan

PyTree = Any


def as_plan(graph: Any, plan: Plan | Mapping[int, Sequence[int]]) -> Plan:
  """Accepts a `Plan` or `{group id: channel indices to remove}`."""
  return plan if isinstance(plan, Plan) else make_plan(graph, plan)


def _leaf_kept(graph: Any, name: str, shape: Sequence[int],
               removed: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
  """`{axis: kept positions}` for the axes of a leaf that lose positions."""
  kept = {}
  for axis, parts in graph.leaf_axes.get(name, {}).items():
    positions = graph.kept_positions(parts, shape[axis], removed)
    if len(positions) != shape[axis]:
      kept[axis] = positions
  return kept


def shrink_variables(graph: Any, variables: PyTree, plan: Plan | Mapping) -> PyTree:
  """Cuts the plan's channels out of every leaf (params, batch_stats, any collection).

  Args:
    graph: the DependencyGraph the plan was made for.
    variables: a pytree with the structure the graph was traced with (a Flax
      Linen variables dict, an NNX `State`, ...).
    plan: a `Plan` or `{group id: channel indices}`.

  Returns:
    The same pytree with smaller leaves.
  """
  plan = as_plan(graph, plan)

  def cut(path, leaf):
    name = names.leaf_name(path)
    for axis, kept in _leaf_kept(graph, name, jnp.shape(leaf), plan.removed).items():
      leaf = jnp.take(leaf, kept, axis=axis)
    return leaf

  return jax.tree_util.tree_map_with_path(cut, variables)


def zero_removed(graph: Any, variables: PyTree, plan: Plan | Mapping) -> PyTree:
  """The dense variables with every removed channel's slices set to zero.

  Every member is zeroed (producer filters, biases, normalisation entries and
  consumer rows), so a removed channel contributes nothing anywhere: the dense
  model computed with these variables is what the pruned model must equal.
  """
  plan = as_plan(graph, plan)

  def zero(path, leaf):
    name = names.leaf_name(path)
    shape = jnp.shape(leaf)
    keep = np.ones(shape, bool)
    for axis, kept in _leaf_kept(graph, name, shape, plan.removed).items():
      axis_keep = np.zeros(shape[axis], bool)
      axis_keep[kept] = True
      keep &= axis_keep.reshape([-1 if a == axis else 1 for a in range(len(shape))])
    return leaf if keep.all() else jnp.where(keep, leaf, jnp.zeros((), jnp.result_type(leaf)))

  return jax.tree_util.tree_map_with_path(zero, variables)


def pruned_callable(graph: Any, plan: Plan | Mapping, jit: bool = True) -> Callable:
  """The traced function at the pruned shapes: `pruned_fn(new_variables, *args)`.

  It replays the traced jaxpr (see `interpret`), so it works for any function
  `trace` accepted, not only Flax modules; it is jittable, differentiable and
  exportable with `jax.export`. Arguments must have the example arguments'
  shapes (the jaxpr was traced at those).

  Args:
    graph: the DependencyGraph.
    plan: the plan applied to the variables.
    jit: wrap the function in `jax.jit`.

  Returns:
    `pruned_fn(new_variables, *args) -> output` with the original output pytree.
  """
  plan = as_plan(graph, plan)
  shrinker = Shrinker(graph, plan.removed)
  closed = graph.closed_jaxpr
  consts = [shrinker.cut((), v, c) for v, c in zip(closed.jaxpr.constvars, closed.consts,
                                                     strict=True)]

  def pruned_fn(new_variables, *args):
    flat, tree = jax.tree_util.tree_flatten((new_variables, *args))
    if tree != graph.in_tree:
      raise ValueError(f'pruned_fn: arguments have structure {tree}, the traced function had '
                       f'{graph.in_tree}; pass (new_variables, *args) like the example.')
    for var, x in zip(closed.jaxpr.invars, flat, strict=True):
      if tuple(jnp.shape(x)) != shrinker.shape((), var):
        raise ValueError(f'pruned_fn: an input has shape {jnp.shape(x)}, expected '
                         f'{shrinker.shape((), var)} (variables from apply_plan with this plan, '
                         'args shaped like the example).')
    outs = eval_jaxpr(shrinker, closed.jaxpr, consts, flat)
    return jax.tree_util.tree_unflatten(graph.out_tree, outs)

  return jax.jit(pruned_fn) if jit else pruned_fn


def apply_plan(graph: Any, variables: PyTree, plan: Plan | Mapping) -> tuple[PyTree, Callable]:
  """Removes the plan's channels: `(new_variables, pruned_fn)`.

  Args:
    graph: the DependencyGraph from `trace(fn, variables, *example_args)`.
    variables: those variables (the dense ones).
    plan: from `select`, or `{group id: channel indices to remove}`.

  Returns:
    `new_variables` (same structure, smaller leaves) and the jitted
    `pruned_fn(new_variables, *args)` computing `fn` at the new shapes.
  """
  plan = as_plan(graph, plan)
  return shrink_variables(graph, variables, plan), pruned_callable(graph, plan)
