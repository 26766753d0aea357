"""Which parameter leaves are matmul weights, what they read, and in what order to prune them.

One-shot pruning (SparseGPT, Wanda) treats each weight as a linear layer
`y = x W`: it needs the layer's input `x`. A jaxpr of `fn(params, batch)` says
this exactly: a leaf is a layer when every use of it (after relayouts such as
`transpose` or a dtype cast, also inside `jit` and custom-derivative bodies,
which are walked in place as `jaxprune.structured` runs them) is one operand of
a `dot_general` with no batch dimensions. Its input axes are the contracted
ones; the other operand is the input activation. Leaves used any other way
(embedding lookups, scales, weights inside `scan` or `cond`) are not layers.

Layers are put in waves: wave 0 reads no layer's output, wave k reads only
outputs of waves below k. SparseGPT's sequential mode prunes a wave with the
inputs computed by the already-pruned earlier waves (Frantar & Alistarh 2023,
arXiv 2301.00774, section 4; q/k/v together, then the output projection, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.extend import core as jcore

from jaxprune.structured._shared import call_body

Scope = tuple[int, ...]
_RELAYOUTS = ('convert_element_type', 'copy', 'copy_p', 'transpose')


@dataclasses.dataclass(frozen=True)
class Site:
  """One `dot_general` reading the weight: where it is and how it contracts."""
  scope: Scope
  index: int            # equation index in its scope
  operand: int          # the activation's operand index (0 or 1)
  contracting: tuple[int, ...]   # the activation's contracted axes, paired with `in_axes`


@dataclasses.dataclass(frozen=True)
class Layer:
  """A parameter leaf used only as a matmul weight.

  Attributes:
    leaf: index of the leaf in `jax.tree.leaves(params)`.
    name: its name, as `jaxprune.leaf_name` gives it (e.g. 'block_0/q/kernel').
    in_axes: the leaf's axes contracted with the input (the input channels), in
      the order they pair with the activation's contracted axes.
    sites: every `dot_general` that reads it.
    wave: its position in the sequential order (see the module docstring).
  """
  leaf: int
  name: str
  in_axes: tuple[int, ...]
  sites: tuple[Site, ...]
  wave: int


class _Walk:
  """Static pass over the jaxpr: views of leaves, taints of layer outputs, uses of leaves."""

  def __init__(self, n_leaves: int):
    self.view: dict[tuple[Scope, Any], tuple[int, tuple[int, ...]]] = {}
    self.taint: dict[tuple[Scope, Any], frozenset[int]] = {}
    self.sites: dict[int, list[tuple[Site, tuple[int, ...], frozenset[int]]]] = {}
    self.other_use: set[int] = set()
    self.n_leaves = n_leaves

  def read(self, scope: Scope, var: Any) -> tuple[Any, frozenset[int]]:
    if isinstance(var, jcore.Literal):
      return None, frozenset()
    return self.view.get((scope, var)), self.taint.get((scope, var), frozenset())

  def walk(self, jaxpr: Any, scope: Scope) -> None:
    for index, eqn in enumerate(jaxpr.eqns):
      reads = [self.read(scope, v) for v in eqn.invars]
      taint = frozenset().union(*(t for _, t in reads))
      views = [v for v, _ in reads]
      body = call_body(eqn)
      inner = getattr(body, 'jaxpr', body)  # a closed or an open jaxpr
      if inner is not None:
        sub = scope + (index, 0)
        for var, (view, t) in zip(inner.invars, reads, strict=True):
          self._set(sub, var, view, t)
        self.walk(inner, sub)
        for out, var in zip(eqn.outvars, inner.outvars, strict=True):
          view, t = self.read(sub, var)
          self._set(scope, out, view, t)
        continue
      name = eqn.primitive.name
      if name in _RELAYOUTS and views[0] is not None:
        leaf, axes = views[0]
        if name == 'transpose':
          axes = tuple(axes[p] for p in eqn.params['permutation'])
        self._set(scope, eqn.outvars[0], (leaf, axes), taint)
        continue
      if name == 'dot_general' and self._dot(scope, index, eqn, views, reads):
        continue
      for view in views:
        if view is not None:
          self.other_use.add(view[0])
      for out in eqn.outvars:
        self._set(scope, out, None, taint)

  def _dot(self, scope, index, eqn, views, reads) -> bool:
    """Records a weight's use by `dot_general`; False when it is not one."""
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params['dimension_numbers']
    if batch_l or batch_r or (views[0] is None) == (views[1] is None):
      return False
    w = 0 if views[0] is not None else 1
    leaf, axes = views[w]
    in_axes = tuple(axes[a] for a in (contract_l, contract_r)[w])
    x_axes = tuple((contract_l, contract_r)[1 - w])
    site = Site(scope, index, 1 - w, x_axes)
    self.sites.setdefault(leaf, []).append((site, in_axes, reads[1 - w][1]))
    self._set(scope, eqn.outvars[0], None, reads[1 - w][1] | {leaf})
    return True

  def _set(self, scope, var, view, taint) -> None:
    if isinstance(var, jcore.DropVar):
      return
    if view is not None:
      self.view[(scope, var)] = view
    if taint:
      self.taint[(scope, var)] = taint


def find_layers(closed: Any, names: list[str]) -> list[Layer]:
  """The layers of a ClosedJaxpr whose first `len(names)` inputs are the param leaves.

  Args:
    closed: `jax.make_jaxpr(fn)(params, batch)`.
    names: the param leaves' names, in flattening order.

  Returns:
    The layers ordered by wave, then by leaf index.
  """
  jaxpr = closed.jaxpr
  walk = _Walk(len(names))
  for leaf, var in enumerate(jaxpr.invars[:len(names)]):
    walk.view[((), var)] = (leaf, tuple(range(len(var.aval.shape))))
  walk.walk(jaxpr, ())
  found = {}
  for leaf, uses in walk.sites.items():
    if leaf in walk.other_use or len({in_axes for _, in_axes, _ in uses}) != 1:
      continue
    found[leaf] = uses
  waves: dict[int, int] = {}

  def wave(leaf: int, visiting: frozenset[int]) -> int:
    if leaf not in waves:
      reads = frozenset().union(*(t for _, _, t in found[leaf])) - visiting - {leaf}
      waves[leaf] = 1 + max((wave(r, visiting | {leaf}) for r in reads if r in found),
                            default=-1)
    return waves[leaf]

  layers = [Layer(leaf, names[leaf], uses[0][1], tuple(s for s, _, _ in uses),
                  wave(leaf, frozenset())) for leaf, uses in found.items()]
  return sorted(layers, key=lambda layer: (layer.wave, layer.leaf))
