"""`trace`: a model's functions (eval, train, ...) into one graph of channel groups.

Each entry point is traced with `jax.make_jaxpr`, walked (`_trace/walker.py`) and its
variables leaves are tied to those of the first entry point, so state that
only one mode reads (BatchNorm running averages updated in training) belongs
to the channels it follows. `_trace/solve.py` turns the walk into groups.

`retrace` traces the same entry points again at other argument shapes; the
pruned callable uses it to run at every shape the original function accepts.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxprune import _names as names
from jaxprune import _warnings as warnings_lib
from jaxprune.structured._core.graph import DependencyGraph, EntryPoint
from jaxprune.structured._core.shapes import is_static
from jaxprune.structured._trace import dataflow, kinds, solve
from jaxprune.structured._trace import norms as norms_lib
from jaxprune.structured._trace.walker import Walker

# (fn, example args, static kwargs) of one entry point.
_Spec = tuple[Callable[..., Any], tuple, dict]


def _output_state_leaf(
  out_name: str, shape: tuple[int, ...], leaf_shapes: dict[str, tuple[int, ...]]
) -> str | None:
  """The variables leaf an output is the new value of (Linen mutable collections).

  An output matches a leaf when its name ends with '/' + the leaf's name, the
  leaf's name has at least two parts ('batch_stats/bn/mean', 'bn/mean'; so a
  list of params named '0', '1' never matches) and the shapes are equal.
  """
  for name, leaf_shape in leaf_shapes.items():
    if leaf_shape == shape and '/' in name and out_name.endswith('/' + name):
      return name
  return None


def _aval(x: Any) -> jax.ShapeDtypeStruct:
  """The shape, dtype and weak type of an array, tracer, aval or ShapeDtypeStruct."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  aval = x if isinstance(x, jax.core.ShapedArray) else jax.typeof(x)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _walk_entry(
  walker: Walker,
  spec: _Spec,
  k: int,
  variables: Any,
  leaf_names: list[str],
  leaf_shapes: dict[str, tuple[int, ...]],
) -> tuple[EntryPoint, set[str]]:
  """Walks entry point `k`; returns it and the names of the leaves it reads."""
  fn, args, kwargs = spec
  closed, out_shapes = jax.make_jaxpr(lambda v, *a: fn(v, *a, **kwargs), return_shape=True)(
    variables, *args
  )
  scope = () if k == 0 else (-k,)
  walker.walk_jaxpr(closed, scope)
  walker.eqn = None
  invars = closed.jaxpr.invars
  leaf_vars = dict(zip(leaf_names, invars, strict=False))
  arg_paths = jax.tree_util.tree_flatten_with_path(tuple(args))[0]
  for var, (path, _) in zip(invars[len(leaf_names) :], arg_paths, strict=True):
    for axis in range(len(var.aval.shape)):
      walker.block_ids(
        walker.ids(var, axis, scope), f'reaches model input {names.leaf_name(path)} axis {axis}'
      )
  out_paths = jax.tree_util.tree_flatten_with_path(out_shapes)[0]
  live_outputs = []
  for var, (path, shape) in zip(closed.jaxpr.outvars, out_paths, strict=True):
    out_name = names.leaf_name(path)
    state_leaf = _output_state_leaf(out_name, tuple(shape.shape), leaf_shapes)
    # A leaf handed back unchanged as its own new value is not read.
    live_outputs.append(state_leaf is None or var is not leaf_vars[state_leaf])
    for axis in range(len(shape.shape)):
      if state_leaf is not None:
        walker.join_axes(var, axis, leaf_vars[state_leaf], axis, scope, scope)
      else:
        walker.block_ids(
          walker.ids(var, axis, scope), f'reaches model output {out_name or 0} axis {axis}'
        )
  live = dataflow.live_inputs(closed.jaxpr, live_outputs)
  read = {name for name, used in zip(leaf_names, live, strict=False) if used}
  arg_avals = tuple(_aval(v.aval) for v in invars[len(leaf_names) :])
  entry = EntryPoint(
    fn,
    dict(kwargs),
    closed,
    jax.tree_util.tree_structure((variables, *args)),
    jax.tree_util.tree_structure(out_shapes),
    scope,
    arg_avals,
  )
  return entry, read


def _trace(
  specs: Sequence[_Spec], variables: Any, norms: str | None = None, classify: bool = True
) -> tuple[DependencyGraph, list[str]]:
  """Traces the entry points into one graph; also returns the unknown-primitive messages.

  `classify` marks the groups' kinds and which width groups are approximate
  (`_trace/kinds.py`, `_trace/norms.py`); a re-trace for the pruned callable needs neither.
  """
  var_leaves = names.named_leaves(variables)
  leaf_names = [name for name, _ in var_leaves]
  leaf_shapes = {name: tuple(np.shape(leaf)) for name, leaf in var_leaves}
  walker = Walker(norms)
  entries, read = [], set()
  for k, spec in enumerate(specs):
    entry, entry_read = _walk_entry(walker, spec, k, variables, leaf_names, leaf_shapes)
    read |= entry_read
    if k:  # the same leaves in every entry point
      for name, first, var in zip(
        leaf_names,
        entries[0].closed_jaxpr.jaxpr.invars,
        entry.closed_jaxpr.jaxpr.invars,
        strict=False,
      ):
        for axis in range(len(leaf_shapes[name])):
          walker.join_axes(first, axis, var, axis, (), entry.scope)
    entries.append(entry)
  messages = [
    f"jaxprune.structured.trace: primitive '{name}' has no channel rule; "
    f'blocked the axes it touches ({count} equation(s)). Register one with '
    'jaxprune.structured.register_rule if it is safe to prune through.'
    for name, count in sorted(walker.unknown.items())
  ]
  leaf_invars = entries[0].closed_jaxpr.jaxpr.invars[: len(leaf_names)]
  graph = solve.build_graph(
    walker,
    entries=entries,
    leaf_names=leaf_names,
    leaf_shapes=leaf_shapes,
    unread=[name for name in leaf_names if name not in read],
    variables_tree=jax.tree_util.tree_structure(variables),
    variables_avals=tuple(_aval(v.aval) for v in leaf_invars),
    blocked_primitives=dict(walker.blocked_primitives),
    warnings=messages,
    norms=norms,
  )
  if classify:
    n_inputs = len(jax.tree_util.tree_leaves(tuple(specs[0][1])))
    group_kinds, sites = kinds.analyse(graph, n_inputs)
    width = norms_lib.classify(graph, walker.reductions, variables, specs[0][1])
    groups = [
      dataclasses.replace(
        g,
        kind='width' if g.id in width else group_kinds.get(g.id, g.kind),
        approximate=width.get(g.id, g.approximate),
      )
      for g in graph.groups
    ]
    graph = dataclasses.replace(graph, groups=groups, activation_sites=sites)
  return graph, messages


def _spec(entry: Any, index: int) -> _Spec:
  if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
    raise TypeError(
      f'also[{index}]: give (fn, args) or (fn, args, kwargs), e.g. '
      f'(functools.partial(model.apply, train=True), (x,)); got {entry!r}.'
    )
  fn, args, *rest = entry
  if not callable(fn):
    raise TypeError(f'also[{index}]: the first element must be fn(variables, *args), got {fn!r}.')
  if not isinstance(args, (tuple, list)):
    raise TypeError(
      f'also[{index}]: the second element must be a tuple of example args, got '
      f'{type(args).__name__}; write (x,) for one argument.'
    )
  kwargs = dict(rest[0]) if rest else {}
  return fn, tuple(args), kwargs


def trace(
  fn: Callable[..., Any],
  variables: Any,
  *example_args: Any,
  also: Sequence[tuple] = (),
  norms: str | None = None,
  **kwargs: Any,
) -> DependencyGraph:
  """Traces `fn(variables, *example_args, **kwargs)` into coupled channel groups.

  Args:
    fn: any JAX function whose first argument is the variables pytree, e.g.
      `model.apply`, `lambda state, x: nnx.merge(graphdef, state)(x)`.
    variables: the pytree of arrays whose channels are to be grouped (arrays
      or `jax.ShapeDtypeStruct`s: only shapes are needed).
    *example_args: example inputs (arrays or pytrees); their axes and the
      function's outputs are never pruned, except outputs that are new values
      of a variables leaf (same name suffix and shape, e.g. Linen's
      `mutable=['batch_stats']` or an NNX `nnx.state(model)`), which are tied
      to that leaf.
    also: more entry points of the same model, each `(fn, args)` or `(fn,
      args, kwargs)` with `fn(variables, *args, **kwargs)`, e.g. the training
      step's forward pass; every entry point's ties hold in the one graph, so
      state read only in one mode follows its channels.
    norms: None (default): a sum over channels (a LayerNorm's or RMSNorm's
      statistics) blocks them, so a transformer's width is not prunable.
      'exact': sums let the channels through and the pruned model keeps the
      full-width divisors; groups where that is not the zeroed dense model
      (a two-pass LayerNorm) are marked approximate. 'renormalise': the
      pruned model divides by the kept width (a standard norm of the smaller
      model); every such group is approximate. With a norms
      option the first entry point runs once on its example inputs.
    **kwargs: static keyword arguments for `fn` (`train=False`, `mutable=...`);
      they are closed over, not traced.

  Returns:
    A `DependencyGraph`. Variables leaves no entry point reads are listed in
    `graph.unread` and never prunable.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import jaxprune.structured as jps
    >>> params = {'w1': jnp.ones((4, 8)), 'w2': jnp.ones((8, 3))}
    >>> fn = lambda p, x: jax.nn.relu(x @ p['w1']) @ p['w2']
    >>> graph = jps.trace(fn, params, jnp.ones((2, 4)))
    >>> [(g.size, sorted(m.leaf for m in g.members)) for g in graph.prunable_groups]
    [(8, ['w1', 'w2'])]
  """
  norms_lib.check_mode(norms)
  specs = [(fn, tuple(example_args), dict(kwargs))]
  specs += [_spec(entry, i) for i, entry in enumerate(also)]
  graph, messages = _trace(specs, variables, norms)
  for message in messages:
    warnings_lib.warn(message)
  return graph


def _signature(avals: Sequence[jax.ShapeDtypeStruct]) -> tuple | None:
  """A hashable key of argument shapes, or None when one is symbolic (not cached)."""
  if not all(is_static(d) for a in avals for d in a.shape):
    return None
  return tuple((tuple(a.shape), str(a.dtype), a.weak_type) for a in avals)


def retrace(graph: DependencyGraph, entry: int, args: Sequence[Any]) -> DependencyGraph:
  """The graph's entry points traced again, entry point `entry` at the shapes of `args`.

  Args:
    graph: a graph from `trace`.
    entry: which entry point gets new arguments.
    args: its arguments (arrays, tracers or `jax.ShapeDtypeStruct`s, symbolic
      dimensions allowed).

  Returns:
    A new graph (cached per static argument shapes). Its groups are numbered
    afresh; `identity.translate` maps a plan onto it.
  """
  flat, tree = jax.tree_util.tree_flatten(tuple(args))
  avals = [_aval(x) for x in flat]
  key = _signature(avals)
  if key is not None and (entry, tree, key) in graph.retraced:
    return graph.retraced[(entry, tree, key)]
  variables = jax.tree_util.tree_unflatten(graph.variables_tree, graph.variables_avals)
  specs = []
  for k, point in enumerate(graph.entries):
    if k == entry:
      point_args = jax.tree_util.tree_unflatten(tree, avals)
    else:
      point_args = jax.tree_util.tree_unflatten(
        point.in_tree, [*graph.variables_avals, *point.arg_avals]
      )[1:]
    specs.append((point.fn, tuple(point_args), point.kwargs))
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # the first trace has already warned
    try:
      new, _ = _trace(specs, variables, graph.norms, classify=False)
    except Exception as e:
      shapes = ', '.join(f'{a.dtype}{list(a.shape)}' for a in avals)
      raise ValueError(
        f'pruned_fn: the traced function does not run on arguments ({shapes}) '
        f'(tracing it again raised {type(e).__name__}: {e})'
      ) from e
  if key is not None:
    graph.retraced[(entry, tree, key)] = new
  return new
