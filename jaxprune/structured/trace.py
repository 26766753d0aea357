"""Walk a jaxpr and record which (variable, axis, position) entries are one channel.

Every axis of size > 1 of every jaxpr variable gets a range of integer ids
(one per position). The trace rules of the primitives table (`primitives.py`)
add edges between ids that must go together, mark ids that may not go (blocked) and record merged
positions (derived from several factor ids). `solve.py` turns this into groups.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from jaxprune import names
from jaxprune.structured import primitives, rules, solve
from jaxprune.structured.groups import DependencyGraph

_Scope = tuple[int, ...]


class _Walker:
  """The `ctx` handed to rules; see `rules.py` for the methods rules may call."""

  def __init__(self):
    self.node_bases: list[int] = []
    self.node_sizes: list[int] = []
    self.node_keys: list[tuple[Any, int] | None] = []   # ((scope, var), axis); None = factor
    self.var_nodes: dict[tuple[_Scope, Any], list[int | None]] = {}
    self.count = 0
    self.edges: list[tuple[np.ndarray, np.ndarray]] = []
    self.blocks: list[tuple[np.ndarray, str]] = []
    self.derived: list[tuple[np.ndarray, np.ndarray]] = []
    self.blocked_primitives: collections.Counter[str] = collections.Counter()
    self.unknown: collections.Counter[str] = collections.Counter()
    self.scope: _Scope = ()
    self.eqn_index = -1
    self.eqn: Any = None

  # -- allocation ---------------------------------------------------------

  def _new_node(self, key: tuple[Any, int] | None, size: int) -> int:
    self.node_bases.append(self.count)
    self.node_sizes.append(size)
    self.node_keys.append(key)
    self.count += size
    return len(self.node_bases) - 1

  def allocate(self, scope: _Scope, var: Any) -> None:
    if isinstance(var, jcore.Literal) or (scope, var) in self.var_nodes:
      return
    shape = tuple(getattr(var.aval, 'shape', ()))
    self.var_nodes[(scope, var)] = [
        self._new_node(((scope, var), axis), n) if n > 1 else None
        for axis, n in enumerate(shape)]

  # -- the rule API -------------------------------------------------------

  def ids(self, var: Any, axis: int, scope: _Scope | None = None) -> np.ndarray | None:
    if isinstance(var, jcore.Literal):
      return None
    nodes = self.var_nodes[(self.scope if scope is None else scope, var)]
    node = nodes[axis]
    if node is None:
      return None
    base = self.node_bases[node]
    return np.arange(base, base + self.node_sizes[node])

  def join(self, a: np.ndarray | None, b: np.ndarray | None) -> None:
    if a is None or b is None:
      return
    if len(a) != len(b):
      raise ValueError(f'rule for {self.eqn.primitive.name!r} joined {len(a)} ids with '
                       f'{len(b)}; a rule must join equal-length id arrays')
    self.edges.append((a, b))

  def join_axes(self, var_a: Any, axis_a: int, var_b: Any, axis_b: int,
                scope_a: _Scope | None = None, scope_b: _Scope | None = None) -> None:
    a, b = self.ids(var_a, axis_a, scope_a), self.ids(var_b, axis_b, scope_b)
    if a is not None and b is not None and len(a) != len(b):
      self.block(var_a, axis_a, scope=scope_a)
      self.block(var_b, axis_b, scope=scope_b)
      return
    self.join(a, b)

  def block(self, var: Any, axis: int, reason: str | None = None,
            scope: _Scope | None = None) -> None:
    ids = self.ids(var, axis, scope)
    if ids is None:
      return
    if reason is None:
      reason = f"blocked by primitive '{self.eqn.primitive.name}'"
      self.blocked_primitives[self.eqn.primitive.name] += 1
    self.blocks.append((ids, reason))

  def block_ids(self, ids: np.ndarray | None, reason: str) -> None:
    if ids is not None and len(ids):
      self.blocks.append((np.asarray(ids), reason))

  def fresh(self, n: int) -> np.ndarray:
    base = self.node_bases[self._new_node(None, n)]
    return np.arange(base, base + n)

  def derive(self, ids: np.ndarray | None, factors: list[np.ndarray]) -> None:
    if ids is None:
      return
    self.derived.append((np.asarray(ids), np.stack(factors, axis=1)))

  def walk(self, jaxpr: Any, sub_index: int) -> _Scope:
    scope = self.scope + (self.eqn_index, sub_index)
    saved = (self.scope, self.eqn_index, self.eqn)
    self.walk_jaxpr(jaxpr, scope)
    self.scope, self.eqn_index, self.eqn = saved
    return scope

  # -- the walk -----------------------------------------------------------

  def walk_jaxpr(self, jaxpr: Any, scope: _Scope) -> None:
    """Allocates ids for `jaxpr` (open or closed) in `scope` and applies rules."""
    if isinstance(jaxpr, jcore.ClosedJaxpr):
      jaxpr = jaxpr.jaxpr
    self.scope = scope
    for var in (*jaxpr.constvars, *jaxpr.invars):
      self.allocate(scope, var)
    for var in jaxpr.constvars:
      for axis in range(len(var.aval.shape)):
        self.block_ids(self.ids(var, axis), f'captured constant of shape {var.aval.shape}')
    for index, eqn in enumerate(jaxpr.eqns):
      for var in eqn.outvars:
        self.allocate(scope, var)
      self.scope, self.eqn_index, self.eqn = scope, index, eqn
      entry = primitives.lookup(eqn.primitive.name)
      if entry is None:
        if any(self.ids(v, a) is not None for v in (*eqn.invars, *eqn.outvars)
               for a in range(len(getattr(v.aval, 'shape', ())))):
          self.unknown[eqn.primitive.name] += 1
        rules.block_all(self, eqn)
      else:
        entry.trace(self, eqn)
      self.scope = scope


def _output_state_leaf(out_name: str, shape: tuple[int, ...],
                       leaf_shapes: dict[str, tuple[int, ...]]) -> str | None:
  """The variables leaf an output is the new value of (Linen mutable collections).

  An output matches a leaf when its name ends with '/' + the leaf's name, the
  leaf's name has at least two parts ('batch_stats/bn/mean', 'bn/mean'; so a
  list of params named '0', '1' never matches) and the shapes are equal.
  """
  for name, leaf_shape in leaf_shapes.items():
    if leaf_shape == shape and '/' in name and out_name.endswith('/' + name):
      return name
  return None


def trace(fn: Callable[..., Any], variables: Any, *example_args: Any,
          **kwargs: Any) -> DependencyGraph:
  """Traces `fn(variables, *example_args, **kwargs)` into coupled channel groups.

  Args:
    fn: any JAX function whose first argument is the variables pytree, e.g.
      `model.apply`, `lambda state, x: nnx.merge(graphdef, state)(x)`.
    variables: the pytree of arrays whose channels are to be grouped.
    *example_args: example inputs (arrays or pytrees); their axes and the
      function's outputs are never pruned, except outputs that are new values
      of a variables leaf (same name suffix and shape, e.g. Linen's
      `mutable=['batch_stats']` or an NNX `nnx.state(model)`), which are tied
      to that leaf.
    **kwargs: static keyword arguments for `fn` (`train=False`, `mutable=...`);
      they are closed over, not traced.

  Returns:
    A `DependencyGraph`.
  """
  closed, out_shapes = jax.make_jaxpr(
      lambda v, *args: fn(v, *args, **kwargs), return_shape=True)(variables, *example_args)
  var_leaves = names.named_leaves(variables)
  leaf_names = [name for name, _ in var_leaves]
  leaf_shapes = {name: tuple(np.shape(leaf)) for name, leaf in var_leaves}
  walker = _Walker()
  walker.walk_jaxpr(closed, ())
  invars = closed.jaxpr.invars
  walker.eqn = None
  arg_paths = jax.tree_util.tree_flatten_with_path(tuple(example_args))[0]
  for var, (path, _) in zip(invars[len(leaf_names):], arg_paths, strict=True):
    for axis in range(len(var.aval.shape)):
      walker.block_ids(walker.ids(var, axis, ()),
                       f'reaches model input {names.leaf_name(path)} axis {axis}')
  out_paths = jax.tree_util.tree_flatten_with_path(out_shapes)[0]
  leaf_vars = dict(zip(leaf_names, invars, strict=False))
  for var, (path, shape) in zip(closed.jaxpr.outvars, out_paths, strict=True):
    out_name = names.leaf_name(path)
    state_leaf = _output_state_leaf(out_name, tuple(shape.shape), leaf_shapes)
    for axis in range(len(shape.shape)):
      if state_leaf is not None:
        walker.join_axes(var, axis, leaf_vars[state_leaf], axis, (), ())
      else:
        walker.block_ids(walker.ids(var, axis, ()),
                         f'reaches model output {out_name or 0} axis {axis}')
  graph_warnings = []
  for name, count in sorted(walker.unknown.items()):
    message = (f"jaxprune.structured.trace: primitive '{name}' has no channel rule; "
               f'blocked the axes it touches ({count} equation(s)). Register one with '
               'jaxprune.structured.register_rule if it is safe to prune through.')
    warnings.warn(message, stacklevel=2)
    graph_warnings.append(message)
  return solve.build_graph(
      walker, closed=closed, leaf_names=leaf_names, leaf_shapes=leaf_shapes,
      in_tree=jax.tree_util.tree_structure((variables, *example_args)),
      out_tree=jax.tree_util.tree_structure(out_shapes),
      blocked_primitives=dict(walker.blocked_primitives), warnings=graph_warnings)

