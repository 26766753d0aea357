"""Which parameter leaves are matmul or convolution weights, what they read, in what order
to prune them, and why the others cannot be pruned.

One-shot pruning (SparseGPT, Wanda) treats each weight as a linear layer
`y = x W`: it needs the layer's input `x`. A jaxpr of `fn(params, batch)` says
this exactly: a leaf is a layer when every use of it (after relayouts such as
`transpose` or a dtype cast, also inside `jit` and custom-derivative bodies,
which are walked in place as `jaxprune.structured` runs them) is one operand of
a `dot_general` with no batch dimensions, or the kernel of a
`conv_general_dilated` (a matmul over the unfolded input patches). Its input
axes are the contracted ones; the other operand is the input activation.

Stacked layers: a leaf passed to a `lax.scan` as a scanned-over operand (xs),
as Flax's `nn.scan`, haiku's `layer_stack` and equinox models scanned over
their stacked blocks do, holds one layer per step; when the body uses its
slice only as such a weight, each slice is a layer of its own (`Layer.stack`),
whose inputs are those of its step.

Layers are put in waves: wave 0 reads no layer's output, wave k reads only
outputs of waves below k. SparseGPT's sequential mode prunes a wave with the
inputs computed by the already-pruned earlier waves (Frantar & Alistarh 2023,
arXiv 2301.00774, section 4; q/k/v together, then the output projection, ...).
Step `t` of a scan reads what its steps before `t` wrote to the carry, so the
slices of a stack come in the order the scan runs them.

Leaves used any other way (embedding lookups, scales, weights inside `while`
or `cond`, a scan's const or carry) are not layers; `find_layers` records why
(`_Walk.reasons`) so that `prune` can name the weights it leaves dense.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from jax.extend import core as jcore

from jaxprune.oneshot import _waves
from jaxprune.structured._shared import call_body, conv_axes, dot_axes, scan_layout

Scope = tuple[int, ...]
ScanKey = tuple[Scope, int]  # (scope, equation index) of a scan
_RELAYOUTS = ('convert_element_type', 'copy', 'copy_p', 'transpose')
# A bias or scale is broadcast or reshaped before its add or mul: that use is its reason.
_RESHAPES = ('broadcast_in_dim', 'reshape', 'squeeze')
_WHY = {
  'while': 'used inside a while loop',
  'cond': 'used inside a cond branch',
  'gather': 'read by a gather, as an embedding lookup is',
}


@dataclasses.dataclass(frozen=True)
class Site:
  """One `dot_general` or `conv_general_dilated` reading the weight: where it is and
  how it contracts."""

  scope: Scope
  index: int  # equation index in its scope
  operand: int  # the activation's operand index (0 or 1)
  contracting: tuple[int, ...]  # the activation's contracted axes, paired with `in_axes`
  conv: bool = False  # a convolution: its input patches are contracted


@dataclasses.dataclass(frozen=True)
class Stack:
  """Where a stacked layer lies: slice `index` along `axis` of its leaf, read at the step
  of the scan at `scan` (its scope and equation index) that takes that slice."""

  scan: ScanKey
  axis: int
  index: int
  length: int


@dataclasses.dataclass(frozen=True)
class Layer:
  """A parameter leaf (or one slice of a stacked leaf) used only as a matmul weight.

  Attributes:
    leaf: index of the leaf in `jax.tree.leaves(params)`.
    name: its name, as `jaxprune.leaf_name` gives it (e.g. 'block_0/q/kernel'), with
      `[index]` appended for a slice of a stacked leaf (e.g. 'blocks/up/kernel[2]').
    in_axes: the leaf's axes contracted with the input (the input channels), in
      the order they pair with the activation's contracted axes (for a convolution
      kernel: its spatial axes, then its input-feature axis).
    sites: every `dot_general` or convolution that reads it.
    wave: its position in the sequential order (see the module docstring).
    stack: for a slice of a stacked leaf, which slice and which scan reads it.
    groups: a convolution's `feature_group_count` (output feature `o` reads the
      input features of group `o // (outputs / groups)`); 1 for a matmul.
  """

  leaf: int
  name: str
  in_axes: tuple[int, ...]
  sites: tuple[Site, ...]
  wave: int
  stack: Stack | None = None
  groups: int = 1


# A taint token: (leaf, None) for a layer's output, (leaf, i) for slice i of a stack's;
# inside a scan body, ('cur', leaf) for the current step's slice, ('prev', leaf) for a
# slice of an earlier step.
Token = tuple[Any, Any]


@dataclasses.dataclass(frozen=True)
class _Use:
  site: Site
  in_axes: tuple[int, ...]
  taint: frozenset[Token]
  stack: tuple[ScanKey, int] | None  # (scan, stacked axis of the leaf)
  groups: int


class _Walk:
  """Static pass over the jaxpr: views of leaves, taints of layer outputs, uses of leaves.

  Attributes:
    uses: leaf -> {(scope, index): its use as a weight there}.
    reasons: leaf -> (why it is not a layer (its first use that is not a weight's), its
      stacked axis where that use reads a stack's slice, else None).
    scans: the layout of each scan that reads a stacked leaf.
  """

  def __init__(self, batched: bool = False):
    self.batched = batched  # see `layers_and_reasons`
    # (scope, var) -> (leaf, leaf axis of each var axis, (scan, stacked axis) or None)
    self.view: dict[tuple[Scope, Any], tuple[int, tuple[int, ...], Any]] = {}
    self.taint: dict[tuple[Scope, Any], frozenset[Token]] = {}
    self.uses: dict[int, dict[tuple[Scope, int], _Use]] = {}
    self.reasons: dict[int, tuple[str, int | None]] = {}
    self.scans: dict[ScanKey, Any] = {}
    self.in_scan: ScanKey | None = None

  def read(self, scope: Scope, var: Any) -> tuple[Any, frozenset[Token]]:
    if isinstance(var, jcore.Literal):
      return None, frozenset()
    return self.view.get((scope, var)), self.taint.get((scope, var), frozenset())

  def refuse(self, views: Iterable[Any], reason: str) -> None:
    """Records `reason` for the leaves of `views` that have none yet, and the stacked
    axis of those refused as a stack's slices (their layers' weights are the slices)."""
    for view in views:
      if view is not None and view[0] not in self.reasons:
        self.reasons[view[0]] = (reason, view[2][1] if view[2] is not None else None)

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
      if name in _RELAYOUTS + _RESHAPES and views[0] is not None:
        leaf, axes, stack = views[0]
        if name in _RESHAPES or axes is None:
          axes = None  # its axes are lost: not a weight, and its next use says why
        elif name == 'transpose':
          axes = tuple(axes[p] for p in eqn.params['permutation'])
        self._set(scope, eqn.outvars[0], (leaf, axes, stack), taint)
        continue
      reshaped = [view for view in views if view is not None and view[1] is None]
      if reshaped:
        why = _WHY.get(name) or f'read by {name}, not only as a matmul weight'
        products = ('dot_general', 'conv_general_dilated')
        self.refuse(reshaped, f'reshaped before a {name}' if name in products else why)
        reads = [(None, t) if v is not None and v[1] is None else (v, t) for v, t in reads]
        views = [v for v, _ in reads]
      if name == 'scan' and self.in_scan is None:
        self._scan(scope, index, eqn, reads)
        continue
      if name == 'dot_general' and self._dot(scope, index, eqn, views, reads):
        continue
      if name == 'conv_general_dilated' and self._conv(scope, index, eqn, views, reads):
        continue
      why = 'used in a scan nested inside a scan' if name == 'scan' else _WHY.get(name)
      self.refuse(views, why or f'read by {name}, not only as a matmul weight')
      for out in eqn.outvars:
        self._set(scope, out, None, taint)

  def _weight(
    self,
    scope: Scope,
    index: int,
    view: Any,
    in_axes: tuple[int, ...],
    site: Site,
    taint: frozenset[Token],
    groups: int = 1,
  ) -> Token:
    """Records a weight's use at a site; the taint token of its output."""
    leaf, _, stack = view
    self.uses.setdefault(leaf, {})[(scope, index)] = _Use(site, in_axes, taint, stack, groups)
    return ('cur', leaf) if stack is not None else (leaf, None)

  def _dot(self, scope, index, eqn, views, reads) -> bool:
    """Records a weight's use by `dot_general`; False when it is not one."""
    (contract_l, contract_r), (batch_l, batch_r) = dot_axes(eqn)
    if views[0] is not None and views[1] is not None:
      self.refuse(views, 'multiplied by another parameter (a dot_general of two weights)')
      return False
    if views[0] is None and views[1] is None:
      return False
    w = 0 if views[0] is not None else 1
    if (batch_l or batch_r) and not (self.batched and (contract_l, contract_r)[w]):
      elementwise = self.batched and not (contract_l, contract_r)[w]
      self.refuse(
        views,
        'multiplied elementwise (by a dot_general that contracts none of its axes)'
        if elementwise
        else 'read by a dot_general with batch dimensions',
      )
      return False
    axes = views[w][1]
    in_axes = tuple(axes[a] for a in (contract_l, contract_r)[w])
    site = Site(scope, index, 1 - w, tuple((contract_l, contract_r)[1 - w]))
    token = self._weight(scope, index, views[w], in_axes, site, reads[1 - w][1])
    self._set(scope, eqn.outvars[0], None, reads[1 - w][1] | {token})
    return True

  def _conv(self, scope, index, eqn, views, reads) -> bool:
    """Records a convolution kernel's use; False when the kernel is not a leaf's view."""
    if views[1] is None:
      return False
    if views[0] is not None or eqn.params['batch_group_count'] != 1:
      self.refuse(views, 'read by a convolution of two weights or with batch_group_count > 1')
      return False
    kernel = conv_axes(eqn)
    axes = views[1][1]
    in_axes = tuple(axes[a] for a in (*kernel.rhs_spatial, kernel.rhs_in))
    site = Site(scope, index, 0, (), conv=True)
    token = self._weight(
      scope, index, views[1], in_axes, site, reads[0][1], groups=eqn.params['feature_group_count']
    )
    self._set(scope, eqn.outvars[0], None, reads[0][1] | {token})
    return True

  def _scan(self, scope: Scope, index: int, eqn: Any, reads: list) -> None:
    """Walks a scan's body: its xs that are views of leaves become stacked views (one
    slice per step), and the carry's taint is iterated until it holds what earlier
    steps wrote to it. Its results are tainted by every step's slices."""
    layout = scan_layout(eqn)
    key = (scope, index)
    sub = scope + (index, 0)
    inner = layout.body.jaxpr
    n_fixed = layout.n_fixed
    for (view, _), var in zip(
      reads[: layout.n_consts], inner.invars[: layout.n_consts], strict=True
    ):
      self.refuse([view], _const_reason(inner, var))
    self.refuse([v for v, _ in reads[layout.n_consts : n_fixed]], 'carried through a scan')
    xs_views = []
    for view, _ in reads[n_fixed:]:
      if view is None:
        xs_views.append(None)
      else:
        leaf, axes, _ = view
        xs_views.append((leaf, axes[1:], (key, axes[0])))
    init = [t for _, t in reads[layout.n_consts : n_fixed]]
    carry = list(init)
    self.in_scan = key
    while True:
      taints = [t for _, t in reads[: layout.n_consts]] + carry + [t for _, t in reads[n_fixed:]]
      views = [None] * n_fixed + xs_views
      for var, view, t in zip(inner.invars, views, taints, strict=True):
        self._set(sub, var, view, t)
      self.walk(inner, sub)
      outs = [self.read(sub, v)[1] for v in inner.outvars]
      new = [start | _earlier(out) for start, out in zip(init, outs[: layout.n_carry], strict=True)]
      if new == carry:
        break
      carry = new
    self.in_scan = None
    self.scans[key] = layout
    for out, t in zip(eqn.outvars, outs, strict=True):
      self._set(scope, out, None, _all_steps(t, layout.length))

  def _set(self, scope, var, view, taint) -> None:
    if isinstance(var, jcore.DropVar):
      return
    if view is not None:
      self.view[(scope, var)] = view
    if taint:
      self.taint[(scope, var)] = taint


def _const_reason(body: Any, var: Any) -> str:
  """Why a scan's const is not pruned: the body reads it whole at every step, or slices
  it per step (`w[i]`, as `fori_loop` bodies do), which only a scanned-over operand does
  in a way this pass follows."""
  if any(
    var in eqn.invars and eqn.primitive.name in ('dynamic_slice', 'gather') for eqn in body.eqns
  ):
    return (
      'a const of a scan that its body slices per step (w[i]); pass the stacked '
      "weights as the scan's xs to prune each step's slice"
    )
  return 'a const of a scan: the same weight at every step'


def _earlier(taint: frozenset[Token]) -> frozenset[Token]:
  """A body value's taint as the next step sees it: this step's slices become earlier ones."""
  return frozenset(('prev', t[1]) if t[0] == 'cur' else t for t in taint)


def _all_steps(taint: frozenset[Token], length: int) -> frozenset[Token]:
  """A body value's taint after the scan: every slice of each stacked leaf it reads."""
  out = set()
  for t in taint:
    if t[0] in ('cur', 'prev'):
      out.update((t[1], i) for i in range(length))
    else:
      out.add(t)
  return frozenset(out)


def find_layers(closed: Any, names: list[str]) -> list[Layer]:
  """The layers of a ClosedJaxpr whose first `len(names)` inputs are the param leaves.

  Args:
    closed: `jax.make_jaxpr(fn)(params, batch)`.
    names: the param leaves' names, in flattening order.

  Returns:
    The layers ordered by wave, then by leaf index and slice.
  """
  return layers_and_reasons(closed, names)[0]


def layers_and_reasons(
  closed: Any, names: list[str], batched: bool = False
) -> tuple[list[Layer], dict[int, tuple[str, int | None]]]:
  """`find_layers`, and for each leaf that is not a layer but is used, why not (and its
  stacked axis, for a use of a stack's slices: the weight is then one slice).

  With `batched`, a `dot_general` with batch dimensions that contracts some of the
  leaf's axes (a block-diagonal or per-head weight) is a weight's use too, as the
  gradual transform's filter (`jaxprune.matmul_weights`) counts it; one-shot pruning,
  whose statistics are those of a plain matmul, does not."""
  jaxpr = closed.jaxpr
  walk = _Walk(batched)
  for leaf, var in enumerate(jaxpr.invars[: len(names)]):
    walk.view[((), var)] = (leaf, tuple(range(len(var.aval.shape))), None)
  walk.walk(jaxpr, ())
  reasons = dict(walk.reasons)
  found: dict[int, list[_Use]] = {}
  for leaf, by_site in walk.uses.items():
    uses = list(by_site.values())
    if leaf in reasons:  # a tied embedding: gathered, and the LM head's weight
      reasons[leaf] = (f'{reasons[leaf][0]}, and elsewhere as a matmul weight', reasons[leaf][1])
      continue
    if len({(u.in_axes, u.stack, u.groups) for u in uses}) != 1:
      reasons[leaf] = (
        'used by several products that contract different axes, or in different scans',
        None,
      )
      continue
    found[leaf] = uses
  waves = _waves.waves(found, walk.scans)
  layers = []
  for leaf, uses in found.items():
    first = uses[0]
    sites = tuple(u.site for u in uses)
    if first.stack is None:
      layers.append(
        Layer(leaf, names[leaf], first.in_axes, sites, waves[(leaf, None)], groups=first.groups)
      )
      continue
    scan, axis = first.stack
    length = walk.scans[scan].length
    for i in range(length):
      layers.append(
        Layer(
          leaf,
          f'{names[leaf]}[{i}]',
          first.in_axes,
          sites,
          waves[(leaf, i)],
          Stack(scan, axis, i, length),
          first.groups,
        )
      )
  order = sorted(
    layers, key=lambda layer: (layer.wave, layer.leaf, layer.stack.index if layer.stack else 0)
  )
  return order, reasons
