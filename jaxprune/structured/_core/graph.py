"""Coupled channel groups: the result of `jaxprune.structured.trace`.

A *channel* is a set of (tensor, axis, position) entries that must be removed
together. A *group* is a set of channels that occupy exactly the same tensor
axes (e.g. the 64 output channels of a conv, together with its BatchNorm's
scale, bias, mean and var and the next conv's input axis). Groups are what a
selector picks channels from and what a shrink removes them from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core import tables

# A jaxpr variable in context: `(scope, var)`. `scope` is () for the top-level
# jaxpr of the first entry point, `(-k,)` for that of entry point k (`trace`'s
# `also`), and `parent_scope + (eqn_index, sub_index)` for a sub-jaxpr, where
# `eqn_index` is the equation's index in its jaxpr and `sub_index` numbers that
# equation's sub-jaxprs: 0 for `jit`, `closed_call`, `remat2`,
# `custom_jvp_call`, `custom_vjp_call` and `scan`; for `while` 0 is
# `cond_jaxpr` and 1 is `body_jaxpr`; for `cond` it is the branch index.
# The scope is needed because one sub-jaxpr object (e.g. `relu`'s) is shared by
# every call site that has the same shapes, so a `Var` alone is ambiguous.
VarKey = tuple[tuple[int, ...], jcore.Var]

# Every `ChannelGroup.kind`: `trace` marks each group with one (`_trace/kinds.py`,
# `_trace/norms.py`), `select(ratio={kind: fraction})` takes them as keys.
KINDS = ('width', 'heads', 'head_dim', 'channels', 'experts', 'recurrent')


@dataclasses.dataclass(frozen=True)
class Member:
  """One axis of one variables leaf that belongs to a group.

  Attributes:
    leaf: the leaf's name (`jaxprune.leaf_name` of its key path), e.g.
      'params/Conv_0/kernel' or 'batch_stats/BatchNorm_0/mean'.
    axis: the axis of that leaf.
    indices: int array of shape `(group.size, k)`; row `c` holds the positions
      on `axis` that channel `c` of the group owns. `k == 1` for a plain axis;
      `k > 1` for a merged axis (NHWC flatten -> Dense: channel c owns
      c, c + C, c + 2C, ...). A concat consumer's member owns an offset range.
  """

  leaf: str
  axis: int
  indices: np.ndarray

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Member):
      return NotImplemented
    return (self.leaf, self.axis) == (other.leaf, other.axis) and np.array_equal(
      self.indices, other.indices
    )

  def __hash__(self) -> int:
    return hash((self.leaf, self.axis, self.indices.shape))


@dataclasses.dataclass(frozen=True)
class AxisPart:
  """The positions of one tensor axis that one group owns.

  Attributes:
    group_id: the owning group's id.
    indices: int array `(group.size, k)`: row `c` = positions of channel `c`.
  """

  group_id: int
  indices: np.ndarray


@dataclasses.dataclass(frozen=True)
class ChannelGroup:
  """Channels that occupy the same axes and are removed with the same plan.

  Attributes:
    id: index in `DependencyGraph.groups`.
    size: number of channels.
    members: every variables leaf axis tied to the group.
    prunable: whether channels may be removed.
    reason: why not, when not prunable (e.g. "reaches model output 0 axis 1",
      "blocked by primitive 'sort'", "scan iteration axis", "no parameters").
    flops_per_channel: FLOPs (dot_general and conv; a multiply-add counts 2)
      saved per channel removed from this group, to first order.
    kind: what the channels are in a transformer: 'width' (the
      residual stream, summed over by a norm: only with `trace(norms=...)`),
      'heads' (attention heads), 'head_dim' (dimensions inside each head),
      'experts' (the experts of a mixture of experts), 'recurrent' (LSTM/GRU
      hidden units) or 'channels' (MLP hidden units and every other group).
    approximate: removing channels changes a norm's statistics, so the pruned
      model only approximates the dense model with them zeroed (`trace(norms=...)`);
      selectors skip such groups unless `Constraint(allow_approximate=True)`.
  """

  id: int
  size: int
  members: list[Member]
  prunable: bool
  reason: str | None
  flops_per_channel: float
  kind: str = 'channels'
  approximate: bool = False


@dataclasses.dataclass(frozen=True)
class EntryPoint:
  """One traced function of a model (`trace`'s `fn`, or one of its `also`).

  Attributes:
    fn: `fn(variables, *args, **kwargs)`.
    kwargs: the static keyword arguments it was traced with.
    closed_jaxpr: the traced jaxpr of `lambda variables, *args: fn(...)`.
    in_tree: treedef of `(variables, *args)`.
    out_tree: treedef of the function's output.
    scope: the scope of its top-level jaxpr in `var_axes` (see `VarKey`).
    arg_avals: `jax.ShapeDtypeStruct` of each flattened example argument.
  """

  fn: Callable[..., Any]
  kwargs: dict[str, Any]
  closed_jaxpr: jcore.ClosedJaxpr
  in_tree: Any
  out_tree: Any
  scope: tuple[int, ...]
  arg_avals: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class DependencyGraph:
  """The channel groups of a traced function, and how they map onto tensors.

  Frozen: `trace` builds every field, then the graph once (the group kinds
  and norms' marks make a new graph with `dataclasses.replace`). Only
  `retraced`, a cache, fills in later.

  Attributes:
    groups: every group, prunable or not.
    leaf_names: names of the variables leaves, in flattening order; the first
      `len(leaf_names)` invars of `closed_jaxpr.jaxpr` are these leaves, the
      rest are the leaves of `example_args` in flattening order.
    leaf_shapes: name -> shape of every variables leaf.
    blocked_primitives: primitive name -> how many axes it blocked.
    total_flops: FLOPs of all dot_general and conv equations per call of the
      first entry point: the dense model's FLOPs, which `prune`,
      `select(flops_target=...)` and `channels.shrink` read from here
      (`plan_flops` of an empty plan counts the same).
    entries: the traced functions; `entries[0]` is `trace`'s `fn` (its
      `closed_jaxpr`, `in_tree` and `out_tree` are also the graph's).
    var_axes: `(scope, var) -> {axis: [AxisPart, ...]}` for every tracked axis
      of every jaxpr variable, top-level and inside sub-jaxprs (see `VarKey`
      for scopes). Axes of size 1 are never tracked and never change size.
      Every position of a tracked axis is owned by at least one part; a plain
      axis has one part with `k == 1`; a concatenated axis has one part per
      piece; a merged axis (flatten, heads x head_dim, grouped conv features)
      has one part per factor, and a position survives a removal only if every
      part owning it keeps its channel. Use `kept_positions` to apply a plan.
    leaf_axes: the same mapping for the variables leaves, by leaf name.
    unread: names of the variables leaves no entry point reads (running
      averages used only in training, unused tokens); their channels are
      never prunable.
    proxied: `(scope, eqn_index) -> equation` for equations that read a
      constant (a captured array, or a value computed from no variable and no
      input): the equation with each constant operand replaced by a proxy
      variable of its own, whose `var_axes` say which positions of the
      constant this use keeps. A constant ties nothing together by itself, so
      slices of one constant (a per-layer head mask) stay per layer.
    notes: `(scope, eqn_index) -> fact` a trace rule kept for its shrink rule
      (e.g. the starts of a gather that is a static slice).
    variables_tree: treedef of the variables.
    variables_avals: `jax.ShapeDtypeStruct` of each variables leaf.
    warnings: human-readable notes produced while tracing (unknown primitives).
    retraced: a cache of this graph traced again at other argument shapes (by
      entry point, argument structure and static shapes), filled by `retrace`.
    norms: `trace`'s `norms` option: None (sums over channels block them),
      'exact' (they pass; the pruned model keeps the full-width divisors) or
      'renormalise' (they pass; the pruned model divides by the kept width).
    activation_sites: `{group id: [(scope, eqn index, operand index or -1
      for the output, axis, that variable)]}`: where activation importance
      measures each group.
    norm_sums: `(scope, eqn index)` of every `reduce_sum` over channels that
      `norms` let through (the statistics `verify` freezes).
  """

  groups: list[ChannelGroup]
  leaf_names: list[str]
  leaf_shapes: dict[str, tuple[int, ...]]
  blocked_primitives: dict[str, int]
  total_flops: float
  entries: list[EntryPoint]
  var_axes: dict[VarKey, dict[int, list[AxisPart]]]
  leaf_axes: dict[str, dict[int, list[AxisPart]]]
  unread: list[str]
  proxied: dict[tuple[tuple[int, ...], int], Any]
  notes: dict[tuple[tuple[int, ...], int], Any]
  variables_tree: Any
  variables_avals: tuple[Any, ...]
  warnings: list[str] = dataclasses.field(default_factory=list)
  retraced: dict[Any, DependencyGraph] = dataclasses.field(default_factory=dict, repr=False)
  norms: str | None = None
  activation_sites: dict[int, list] = dataclasses.field(default_factory=dict, repr=False)
  norm_sums: list[tuple[tuple[int, ...], int]] = dataclasses.field(default_factory=list)

  @property
  def closed_jaxpr(self) -> jcore.ClosedJaxpr:
    return self.entries[0].closed_jaxpr

  @property
  def in_tree(self) -> Any:
    return self.entries[0].in_tree

  @property
  def out_tree(self) -> Any:
    return self.entries[0].out_tree

  @property
  def prunable_groups(self) -> list[ChannelGroup]:
    return [g for g in self.groups if g.prunable]

  @property
  def channel_groups(self) -> list[ChannelGroup]:
    """The groups of feature channels: those with a variables axis, less the spatial and
    window axes of convolutions and pooling and the iteration axes of scans (groups of
    positions, not channels). What results count as channels."""
    positions = ('spatial axis', 'window axis', 'scan iteration axis')
    return [g for g in self.groups if g.members and not (g.reason or '').startswith(positions)]

  @property
  def approximate_groups(self) -> list[ChannelGroup]:
    """Prunable groups whose removal changes a norm's statistics (see `ChannelGroup`)."""
    return [g for g in self.groups if g.prunable and g.approximate]

  def kept_positions(
    self, parts: Sequence[AxisPart], axis_size: int, removed: Mapping[int, np.ndarray]
  ) -> np.ndarray:
    """Positions of an axis that survive removing channels.

    Args:
      parts: `var_axes[key][axis]` or `leaf_axes[name][axis]`.
      axis_size: the axis's size before removal.
      removed: group id -> int array of channel indices (rows of the parts'
        `indices`) to remove; groups not listed lose nothing.

    Returns:
      Sorted int array of the positions kept.
    """
    dropped = [
      part.indices[np.asarray(removed[part.group_id], dtype=np.int64)].ravel()
      for part in parts
      if part.group_id in removed
    ]
    if not dropped:
      return np.arange(axis_size)
    return np.setdiff1d(np.arange(axis_size), np.concatenate(dropped))

  def new_shape(
    self,
    shape: Sequence[int],
    axes: Mapping[int, Sequence[AxisPart]],
    removed: Mapping[int, np.ndarray],
  ) -> tuple[int, ...]:
    """The shape of a tensor after removing channels (see `kept_positions`)."""
    return tuple(
      len(self.kept_positions(axes[a], n, removed)) if a in axes else n for a, n in enumerate(shape)
    )

  def summary(self) -> str:
    """Groups, channels, prunable share, blocked primitives, FLOPs."""
    return tables.summary(self)

  def group_table(self, group_id: int) -> str:
    """One group: its members, their axes and the positions of channel 0."""
    return tables.group_table(self, group_id)

  def leaf_table(self, leaf_name: str) -> str:
    """One leaf: which group owns each of its axes."""
    return tables.leaf_table(self, leaf_name)

  def unprunable_table(self) -> str:
    """All unprunable groups with their reasons."""
    return tables.unprunable_table(self)
