"""Applies a plan: smaller variables and the pruned callable.

The public functions take a `Plan` or `{group id: channels}` and normalise it
once (`as_plan`); `cut_variables`, `zeroed_variables` and `replayed_fn` are
the stage's implementation and take a `Plan` already in the graph's ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _names as names
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.plan import Plan, as_plan, check_variables, plan_for
from jaxprune.structured._core.shapes import same_avals
from jaxprune.structured._shrink.shrinker import Shrinker
from jaxprune.structured._trace import tracing as trace_lib

PyTree = Any


def _leaf_kept(
  graph: DependencyGraph, name: str, shape: Sequence[int], removed: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
  """`{axis: kept positions}` for the axes of a leaf that lose positions."""
  kept = {}
  for axis, parts in graph.leaf_axes.get(name, {}).items():
    positions = graph.kept_positions(parts, shape[axis], removed)
    if len(positions) != shape[axis]:
      kept[axis] = positions
  return kept


def shrink_variables(graph: DependencyGraph, variables: PyTree, plan: Plan | Mapping) -> PyTree:
  """Cuts the plan's channels out of every leaf (params, batch_stats, any collection).

  Args:
    graph: the DependencyGraph the plan was made for.
    variables: a pytree with the structure the graph was traced with (a Flax
      Linen variables dict, an NNX `State`, ...).
    plan: a `Plan` or `{group id: channel indices}`.

  Returns:
    The same pytree with smaller leaves.
  """
  return cut_variables(graph, variables, as_plan(graph, plan))


def cut_variables(graph: DependencyGraph, variables: PyTree, plan: Plan) -> PyTree:
  """`shrink_variables` for a normalised plan."""

  def cut(path, leaf):
    name = names.leaf_name(path)
    traced = graph.leaf_shapes.get(name)
    if traced is not None and tuple(jnp.shape(leaf)) != traced:
      raise ValueError(
        f'shrink_variables: leaf {name!r} has shape {jnp.shape(leaf)}, the graph '
        f'was traced with {traced}; pass the dense variables given to trace.'
      )
    kept = _leaf_kept(graph, name, jnp.shape(leaf), plan.removed)
    if not kept:
      return leaf
    # On the host: one XLA compile per leaf shape would dominate for big models.
    xp = jnp if isinstance(leaf, jax.core.Tracer) else np
    leaf = xp.asarray(leaf)
    for axis, positions in kept.items():
      leaf = xp.take(leaf, positions, axis=axis)
    return jnp.asarray(leaf)

  return jax.tree_util.tree_map_with_path(cut, variables)


def zero_removed(graph: DependencyGraph, variables: PyTree, plan: Plan | Mapping) -> PyTree:
  """The dense variables with every removed channel's slices set to zero.

  Every member is zeroed (producer filters, biases, normalisation entries and
  consumer rows), so a removed channel contributes nothing anywhere: the dense
  model computed with these variables is what the pruned model must equal.
  """
  return zeroed_variables(graph, variables, as_plan(graph, plan))


def zeroed_variables(graph: DependencyGraph, variables: PyTree, plan: Plan) -> PyTree:
  """`zero_removed` for a normalised plan."""

  def zero(path, leaf):
    name = names.leaf_name(path)
    shape = jnp.shape(leaf)
    keep = np.ones(shape, bool)
    for axis, kept in _leaf_kept(graph, name, shape, plan.removed).items():
      axis_keep = np.zeros(shape[axis], bool)
      axis_keep[kept] = True
      keep &= axis_keep.reshape([-1 if a == axis else 1 for a in range(len(shape))])
    if keep.all():
      return leaf
    xp = jnp if isinstance(leaf, jax.core.Tracer) else np
    leaf = xp.asarray(leaf)
    return jnp.asarray(xp.where(keep, leaf, xp.zeros((), leaf.dtype)))

  return jax.tree_util.tree_map_with_path(zero, variables)


class _Replay:
  """The jaxpr of one entry point of one trace, evaluated under one plan."""

  def __init__(self, graph: DependencyGraph, plan: Plan, entry: int):
    """`plan` in `graph`'s group ids."""
    self.point = graph.entries[entry]
    self.shrinker = Shrinker(graph, plan.removed)

  def __call__(self, flat: list[Any]) -> Any:
    closed = self.point.closed_jaxpr
    outs = self.shrinker.run(closed.jaxpr, closed.consts, flat, self.point.scope)
    return jax.tree_util.tree_unflatten(self.point.out_tree, outs)


def pruned_callable(
  graph: DependencyGraph, plan: Plan | Mapping, jit: bool = True, entry: int = 0
) -> Callable:
  """The traced function at the pruned shapes: `pruned_fn(new_variables, *args)`.

  It replays the traced jaxpr (see `Shrinker`), so it works for any function
  `trace` accepted, not only Flax modules. It runs at every input shape the
  original function accepts (batch 1, other batches, other sequence lengths):
  at a shape other than the example's, the function is traced again at that
  shape, like `jax.jit` does, and the plan is mapped onto the new trace by
  group identity. It is jittable, differentiable and exportable with
  `jax.export`, also with symbolic dimensions
  (`jax.export.symbolic_shape('b, 224, 224, 3')`).

  Args:
    graph: the DependencyGraph.
    plan: the plan applied to the variables.
    jit: wrap the function in `jax.jit`.
    entry: which entry point of `trace` (0 is `fn`; 1, 2, ... are `also`).

  Returns:
    `pruned_fn(new_variables, *args) -> output` with the entry point's output pytree.
  """
  if not 0 <= entry < len(graph.entries):
    raise ValueError(
      f'entry={entry}: the graph has {len(graph.entries)} entry point(s) '
      f'(0..{len(graph.entries) - 1}).'
    )
  return replayed_fn(graph, as_plan(graph, plan), jit, entry)


def replayed_fn(graph: DependencyGraph, plan: Plan, jit: bool = True, entry: int = 0) -> Callable:
  """`pruned_callable` for a normalised plan and a valid entry point."""
  point = graph.entries[entry]
  shrinker = Shrinker(graph, plan.removed)
  leaf_vars = point.closed_jaxpr.jaxpr.invars[: len(graph.leaf_names)]
  expected = [shrinker.shape(point.scope, v) for v in leaf_vars]
  replays = {id(graph): _Replay(graph, plan, entry)}

  def replay_for(new_variables, args):
    example = jax.tree_util.tree_structure((new_variables, *args)) == point.in_tree and same_avals(
      point.arg_avals, jax.tree_util.tree_leaves(args)
    )
    if example:
      return replays[id(graph)]
    traced = trace_lib.retrace(graph, entry, args)
    if any(traced is g for g in graph.retraced.values()):  # static shapes: kept
      if id(traced) not in replays:
        replays[id(traced)] = _Replay(traced, plan_for(traced, plan), entry)
      return replays[id(traced)]
    return _Replay(traced, plan_for(traced, plan), entry)

  def pruned_fn(new_variables, *args):
    flat, tree = jax.tree_util.tree_flatten(new_variables)
    if tree != graph.variables_tree:
      raise ValueError(
        f'pruned_fn: new_variables have structure {tree}, the traced variables '
        f'had {graph.variables_tree}; pass the variables apply_plan returned.'
      )
    for name, x, want in zip(graph.leaf_names, flat, expected, strict=True):
      if tuple(jnp.shape(x)) != want:
        raise ValueError(
          f'pruned_fn: variables leaf {name!r} has shape {jnp.shape(x)}, '
          f'expected {want} (pass the variables apply_plan returned for this '
          'plan).'
        )
    return replay_for(new_variables, args)([*flat, *jax.tree_util.tree_leaves(args)])

  return jax.jit(pruned_fn) if jit else pruned_fn


def apply_plan(
  graph: DependencyGraph, variables: PyTree, plan: Plan | Mapping
) -> tuple[PyTree, Callable]:
  """Removes the plan's channels: `(new_variables, pruned_fn)`.

  Args:
    graph: the DependencyGraph from `trace(fn, variables, *example_args)`.
    variables: those variables (the dense ones).
    plan: from `select`, or `{group id: channel indices to remove}`.

  Returns:
    `new_variables` (same structure, smaller leaves) and the jitted
    `pruned_fn(new_variables, *args)` computing `fn` at the new shapes.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import jaxprune.structured as jps
    >>> k1, k2 = jax.random.split(jax.random.key(0))
    >>> params = {'w1': jax.random.normal(k1, (4, 8)), 'w2': jax.random.normal(k2, (8, 3))}
    >>> fn = lambda p, x: jax.nn.relu(x @ p['w1']) @ p['w2']
    >>> x = jnp.ones((2, 4))
    >>> graph = jps.trace(fn, params, x)
    >>> plan = jps.select(graph, params, ratio=0.5)
    >>> new_params, pruned_fn = jps.apply_plan(graph, params, plan)
    >>> new_params['w1'].shape, new_params['w2'].shape, pruned_fn(new_params, x).shape
    ((4, 4), (4, 3), (2, 3))
    >>> bool(jps.verify(graph, params, plan, x))
    True
  """
  check_variables(graph, variables, 'apply_plan')
  plan = as_plan(graph, plan)
  return cut_variables(graph, variables, plan), replayed_fn(graph, plan)
