"""Walk a jaxpr and record which (variable, axis, position) entries are one channel.

Every static axis of size > 1 of every jaxpr variable gets a range of integer
ids (one per position). The trace rules of the primitives table
(`_primitives/table.py`) add edges between ids that must go together, mark ids that
may not go (blocked) and record merged positions (derived from several factor
ids). `_trace/solve.py` turns this into groups.

Constants (see `_trace/dataflow.py`) get no ids: an equation computed from constants
alone is not walked, and each equation that reads a constant reads a proxy
variable of its own instead, so one constant never ties two of its uses.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core.shapes import is_static
from jaxprune.structured._primitives import rules, shrink_rules, table
from jaxprune.structured._trace import dataflow

Scope = tuple[int, ...]


class Walker:
  """The `ctx` handed to rules; see `_primitives/rules.py` for the methods rules may call."""

  def __init__(self, norms: str | None = None):
    self.norms = norms
    # (scope, eqn index, operand, axis) of each sum over a tracked axis let through.
    self.reductions: list[tuple[Scope, int, Any, int]] = []
    self.node_bases: list[int] = []
    self.node_sizes: list[int] = []
    self.node_keys: list[tuple[Any, int] | None] = []  # ((scope, var), axis); None = factor
    self.var_nodes: dict[tuple[Scope, Any], list[int | None]] = {}
    self.constants: set[tuple[Scope, Any]] = set()
    self.proxied: dict[tuple[Scope, int], Any] = {}
    self.notes: dict[tuple[Scope, int], Any] = {}
    self._proxy_of: dict[tuple[Scope, Any], Any] = {}
    self._const_eqns: dict[tuple[Scope, Any], Any] = {}
    self._const_values: dict[tuple[Scope, Any], Any] = {}
    self.count = 0
    self.edges: list[tuple[np.ndarray, np.ndarray]] = []
    self.blocks: list[tuple[np.ndarray, str]] = []
    self.derived: list[tuple[np.ndarray, np.ndarray]] = []
    self.blocked_primitives: collections.Counter[str] = collections.Counter()
    self.unknown: collections.Counter[str] = collections.Counter()
    self.scope: Scope = ()
    self.eqn_index = -1
    self.eqn: Any = None

  # -- allocation ---------------------------------------------------------

  def _new_node(self, key: tuple[Any, int] | None, size: int) -> int:
    self.node_bases.append(self.count)
    self.node_sizes.append(size)
    self.node_keys.append(key)
    self.count += size
    return len(self.node_bases) - 1

  def allocate(self, scope: Scope, var: Any) -> None:
    if (
      isinstance(var, jcore.Literal)
      or (scope, var) in self.var_nodes
      or (scope, var) in self.constants
    ):
      return
    shape = tuple(getattr(var.aval, 'shape', ()))
    self.var_nodes[(scope, var)] = [
      self._new_node(((scope, var), axis), n) if is_static(n) and n > 1 else None
      for axis, n in enumerate(shape)
    ]

  # -- the rule API -------------------------------------------------------

  def ids(self, var: Any, axis: int, scope: Scope | None = None) -> np.ndarray | None:
    scope = self.scope if scope is None else scope
    if isinstance(var, jcore.Literal) or (scope, var) in self.constants:
      return None
    node = self.var_nodes[(scope, var)][axis]
    if node is None:
      return None
    base = self.node_bases[node]
    return np.arange(base, base + self.node_sizes[node])

  def join(self, a: np.ndarray | None, b: np.ndarray | None) -> None:
    if a is None or b is None:
      return
    if len(a) != len(b):
      raise ValueError(
        f'rule for {self.eqn.primitive.name!r} joined {len(a)} ids with '
        f'{len(b)}; a rule must join equal-length id arrays'
      )
    self.edges.append((a, b))

  def join_axes(
    self,
    var_a: Any,
    axis_a: int,
    var_b: Any,
    axis_b: int,
    scope_a: Scope | None = None,
    scope_b: Scope | None = None,
  ) -> None:
    a, b = self.ids(var_a, axis_a, scope_a), self.ids(var_b, axis_b, scope_b)
    if a is not None and b is not None and len(a) != len(b):
      self.block(var_a, axis_a, scope=scope_a)
      self.block(var_b, axis_b, scope=scope_b)
      return
    self.join(a, b)

  def block(
    self, var: Any, axis: int, reason: str | None = None, scope: Scope | None = None
  ) -> None:
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

  def value(self, var: Any) -> np.ndarray | None:
    """The value of a constant operand (evaluated once), or None when it is not
    a constant or has a symbolic shape."""
    if isinstance(var, jcore.Literal):
      return np.asarray(var.val)
    key = self._proxy_of.get((self.scope, var), (self.scope, var))
    if key in self._const_values:
      return self._const_values[key]
    eqn = self._const_eqns.get(key)
    if eqn is None or not all(
      is_static(d) for v in (*eqn.invars, *eqn.outvars) for d in getattr(v.aval, 'shape', ())
    ):
      return None
    saved = self.scope
    self.scope = key[0]
    operands = [self.value(v) for v in eqn.invars]
    self.scope = saved
    if any(x is None for x in operands):
      return None
    if eqn.primitive.name == 'dim_as_value':
      return None  # a symbolic dimension (`jax.export`) as a value: unknown when tracing
    with jax.ensure_compile_time_eval():  # also when re-traced inside jit or export
      outs = shrink_rules.bind(eqn, operands)
    for out, x in zip(eqn.outvars, outs, strict=True):
      self._const_values[(key[0], out)] = np.asarray(x)
    return self._const_values[key]

  def reduction(self, var: Any, axis: int) -> None:
    """Records that the current equation sums `var` over `axis`, leaving it prunable."""
    if self.ids(var, axis) is not None:
      self.reductions.append((self.scope, self.eqn_index, var, axis))

  def note(self, fact: Any) -> None:
    """Keeps a fact about the current equation for its shrink rule (`graph.notes`)."""
    self.notes[(self.scope, self.eqn_index)] = fact

  def walk(self, jaxpr: Any, sub_index: int) -> Scope:
    scope = self.scope + (self.eqn_index, sub_index)
    saved = (self.scope, self.eqn_index, self.eqn)
    self.walk_jaxpr(jaxpr, scope)
    self.scope, self.eqn_index, self.eqn = saved
    return scope

  # -- the walk -----------------------------------------------------------

  def walk_jaxpr(self, jaxpr: Any, scope: Scope) -> None:
    """Allocates ids for `jaxpr` (open or closed) in `scope` and applies rules."""
    if isinstance(jaxpr, jcore.ClosedJaxpr):
      for var, value in zip(jaxpr.jaxpr.constvars, jaxpr.consts, strict=True):
        self._const_values[(scope, var)] = value
      jaxpr = jaxpr.jaxpr
    self.scope = scope
    constant = dataflow.constants(jaxpr)
    self.constants.update((scope, v) for v in constant)
    for var in (*jaxpr.constvars, *jaxpr.invars):
      self.allocate(scope, var)
    for index, eqn in enumerate(jaxpr.eqns):
      if all(v in constant for v in eqn.outvars if isinstance(v, jcore.Var)) and eqn.outvars:
        self._const_eqns.update(((scope, v), eqn) for v in eqn.outvars)
        continue  # computed from constants alone: nothing to tie
      for var in eqn.outvars:
        self.allocate(scope, var)
      eqn = self._proxy_constants(scope, index, eqn, constant)
      self.scope, self.eqn_index, self.eqn = scope, index, eqn
      entry = table.lookup(eqn.primitive.name)
      if entry is None:
        if any(
          self.ids(v, a) is not None
          for v in (*eqn.invars, *eqn.outvars)
          for a in range(len(getattr(v.aval, 'shape', ())))
        ):
          self.unknown[eqn.primitive.name] += 1
        rules.block_all(self, eqn)
      else:
        try:
          entry.trace(self, eqn)
        except jcore.InconclusiveDimensionOperation:
          # A comparison of symbolic dimensions (jax.export) the rule cannot
          # decide: keep every axis it touches.
          rules.block_all(self, eqn)
      self.scope = scope

  def _proxy_constants(self, scope: Scope, index: int, eqn: Any, constant: set[Any]) -> Any:
    """The equation with each constant operand replaced by a fresh proxy variable."""
    if not any(isinstance(v, jcore.Var) and v in constant for v in eqn.invars):
      return eqn
    invars = []
    for var in eqn.invars:
      if isinstance(var, jcore.Var) and var in constant:
        proxy = jcore.Var(var.aval)
        self._proxy_of[(scope, proxy)] = (scope, var)
        var = proxy
        self.allocate(scope, var)
      invars.append(var)
    eqn = eqn.replace(invars=invars)
    self.proxied[(scope, index)] = eqn
    return eqn
