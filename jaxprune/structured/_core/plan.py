"""A pruning plan (which channels of which group go) and the per-group constraints."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxprune import _names as names
from jaxprune.structured._core import identity
from jaxprune.structured._core.graph import DependencyGraph


@dataclasses.dataclass(frozen=True)
class Plan:
  """Channels to remove, per channel group.

  Attributes:
    removed: `{group id: sorted int array of removed channel indices}`; groups
      not listed keep all their channels.
    sizes: `{group id: group size}` for every group of the graph.
    keys: `{group id: GroupKey}` for the groups in `removed`: what each group
      ties, so the plan applies to another trace of the same model (another
      input shape or entry point; docs/explanation/structured_design.md#select). A plan without keys
      applies only to the graph whose ids it uses.
    notes: what the selector could not do as asked (rounding that kept more
      channels, nothing removed); `summary()` prints them.
    shortfall: None when the plan removes what its target asked for; else one
      line saying what was asked, what the plan removes and why (no prunable
      group, the constraint, a target out of reach). `verify` and `prune`'s
      result carry it.
  """

  removed: Mapping[int, np.ndarray]
  sizes: Mapping[int, int]
  keys: Mapping[int, identity.GroupKey] = dataclasses.field(default_factory=dict)
  notes: tuple[str, ...] = ()
  shortfall: str | None = None

  def kept(self, group_id: int) -> np.ndarray:
    """Sorted indices of the channels that stay in a group."""
    keep = np.ones(self.sizes[group_id], bool)
    keep[self.removed.get(group_id, np.zeros(0, int))] = False
    return np.flatnonzero(keep)

  @property
  def num_removed(self) -> int:
    return int(sum(len(r) for r in self.removed.values()))

  def summary(self, graph: DependencyGraph | None = None) -> str:
    """One line per group that loses channels: `group 3: 64 -> 32`; then how many were
    removed of all, counting with `graph` (its DependencyGraph) only feature channels
    (`graph.channel_groups`: not a convolution's spatial axes)."""
    lines = [
      f'group {gid}: {self.sizes[gid]} -> {self.sizes[gid] - len(r)}'
      for gid, r in sorted(self.removed.items())
      if len(r)
    ]
    total = f'{sum(self.sizes.values())} channels'
    if graph is not None:
      counted = graph.channel_groups
      prunable = sum(g.size for g in counted if g.prunable)
      total = f'{prunable} prunable channels ({sum(g.size for g in counted)} in all)'
    lines.append(
      f'removed {self.num_removed} of {total}'
      + (' (nothing removed)' if not self.num_removed else '')
    )
    shortfall = [] if self.shortfall is None else [f'SHORT OF THE TARGET: {self.shortfall}']
    return '\n'.join(lines + shortfall + list(self.notes))


def _channel_indices(gid: int, size: int, channels: Any) -> np.ndarray:
  """Sorted unique channel indices from indices or a boolean mask of the group's size."""
  array = np.asarray(channels)
  if array.dtype == bool:
    if array.shape != (size,):
      raise ValueError(
        f'plan: group {gid}: a boolean mask needs one entry per channel '
        f'(shape ({size},)), got shape {array.shape}; or give channel indices.'
      )
    return np.flatnonzero(array)
  if array.ndim > 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
    raise TypeError(
      f'plan: group {gid}: give channel indices (ints) or a boolean mask of '
      f'{size} entries (True = remove); got {array.dtype} of shape {array.shape}.'
    )
  return np.unique(array.astype(np.int64))


def make_plan(graph: DependencyGraph, removed: Mapping[int, Sequence[int]]) -> Plan:
  """Builds a checked Plan from `{group id: channels to remove}`.

  Args:
    graph: the DependencyGraph whose group ids `removed` uses.
    removed: per group, channel indices, or a boolean mask of the group's size
      where True marks a channel to remove.

  Raises:
    ValueError: for an unknown or unprunable group, an index out of range, a
      mask of the wrong size, or a plan that would empty a group.
    TypeError: for channels that are neither integers nor a boolean mask.
  """
  groups = {g.id: g for g in graph.groups}
  out, keys = {}, {}
  for gid, channels in removed.items():
    if gid not in groups:
      raise ValueError(f'plan: group {gid} does not exist (the graph has ids {sorted(groups)}).')
    group = groups[gid]
    channels = _channel_indices(gid, group.size, channels)
    if channels.size == 0:
      continue
    if not group.prunable:
      raise ValueError(f'plan: group {gid} is not prunable ({group.reason}); leave it out.')
    if channels[0] < 0 or channels[-1] >= group.size:
      raise ValueError(
        f'plan: group {gid} has channels 0..{group.size - 1}, got '
        f'{channels.min()}..{channels.max()}.'
      )
    if channels.size >= group.size:
      raise ValueError(
        f'plan: removing all {group.size} channels of group {gid} would '
        'empty it; keep at least one.'
      )
    out[gid] = channels
    keys[gid] = identity.group_key(group)
  return Plan(removed=out, sizes={g.id: g.size for g in graph.groups}, keys=keys)


def check_variables(graph: DependencyGraph, variables: Any, where: str) -> None:
  """Raises a ValueError when `variables` are not shaped as the ones `graph` was traced with."""
  tree = jax.tree_util.tree_structure(variables)
  if tree != graph.variables_tree:
    raise ValueError(
      f'{where}: variables have structure {tree}, the graph was traced with '
      f'{graph.variables_tree}; pass the dense variables given to trace.'
    )
  for name, leaf in names.named_leaves(variables):
    shape = tuple(np.shape(leaf))
    if shape != graph.leaf_shapes[name]:
      raise ValueError(
        f'{where}: variables leaf {name!r} has shape {shape}, the graph was '
        f'traced with {graph.leaf_shapes[name]}; pass the dense variables given '
        'to trace (or trace these).'
      )


def _check_channels(plan: Plan) -> None:
  """Each group's channels are integers in range (a Plan built by hand is not checked)."""
  for gid, channels in plan.removed.items():
    channels = np.asarray(channels)
    size = plan.sizes.get(gid)
    if size is None:
      raise ValueError(
        f'plan: group {gid} has no size in plan.sizes; build plans with make_plan or select.'
      )
    if channels.size and (
      not np.issubdtype(channels.dtype, np.integer) or channels.min() < 0 or channels.max() >= size
    ):
      raise ValueError(
        f'plan: group {gid} has channels 0..{size - 1}, the plan removes '
        f'{channels.tolist()}; build plans with make_plan or select, which '
        'check them.'
      )


def plan_for(graph: DependencyGraph, plan: Plan) -> Plan:
  """The plan in `graph`'s group ids: translated by group identity when it has keys.

  Raises:
    ValueError: naming a group the plan removes channels from that `graph`
      does not have (or has, unprunable), or, for a plan without keys, ids or
      sizes that do not fit `graph`.
  """
  groups = {g.id: g for g in graph.groups}
  if plan.keys:
    _check_channels(plan)
    removed = identity.translate(dict(plan.removed), dict(plan.keys), graph)
    return Plan(
      removed,
      {g.id: g.size for g in graph.groups},
      {gid: identity.group_key(groups[gid]) for gid in removed},
    )
  for gid, channels in plan.removed.items():
    group = groups.get(gid)
    if group is None or group.size != plan.sizes.get(gid):
      raise ValueError(
        f'plan: group {gid} has {plan.sizes.get(gid)} channels in the plan and '
        f'{group.size if group else "no group"} in this graph; apply a plan to the '
        'graph it was made for, or make it with make_plan or select (they record '
        'what each group ties, so the plan carries over to other traces).'
      )
    if len(channels) and not group.prunable:
      raise ValueError(f'plan: group {gid} is not prunable ({group.reason}).')
  _check_channels(plan)
  return plan


def as_plan(graph: DependencyGraph, plan: Plan | Mapping[int, Sequence[int]]) -> Plan:
  """The one normalisation of a plan, at the public boundary of every stage.

  Accepts a `Plan` (made on this graph or another trace of the same model:
  translated by `plan_for`) or `{group id: channel indices to remove}` of this
  graph (checked by `make_plan`). Internal stages take the `Plan` it returns.
  """
  if isinstance(plan, Plan):
    return plan_for(graph, plan)
  if not isinstance(plan, Mapping):
    raise TypeError(
      f'plan: give a Plan (from select or make_plan) or {{group id: channels}}, '
      f'got {type(plan).__name__}.'
    )
  return make_plan(graph, plan)


@dataclasses.dataclass(frozen=True)
class Constraint:
  """Limits every selector respects (ENOT's channels selector constraint).

  Attributes:
    min_channels: keep at least this many channels per group (capped at its size).
    min_ratio: keep at least this fraction of each group.
    round_to: the kept count is a multiple of this, or the whole group.
      Selectors round the kept count up (as Torch-Pruning does), so a ratio is
      never exceeded: a group of 16 at ratio 0.25 with round_to=8 keeps all
      16, and the plan's summary says so. 1 (the default) removes the ratio
      asked for. 8 runs faster where groups are large enough: over eight
      third-party models at ratio 0.3 on CPU (benchmarks/thirdparty.py) the
      geometric-mean speedup was 1.92x unrounded, 2.12x at 4, 2.19x at 8,
      2.17x at 16, and the slowest model 0.78x unrounded against 1.24x at 8.
    locked: regexes; a group is left alone when any member leaf name matches.
    allow_approximate: also remove channels of groups marked approximate
      (`ChannelGroup.approximate`: width groups whose norm statistics change,
      see `trace(norms=...)`); off, selectors leave them whole.
  """

  min_channels: int = 1
  min_ratio: float = 0.0
  round_to: int = 1
  locked: Sequence[str] = ()
  allow_approximate: bool = False

  def __post_init__(self):
    for field in ('min_channels', 'round_to'):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f'Constraint({field}={value!r}): give an int, e.g. {field}=1.')
    if isinstance(self.min_ratio, bool) or not isinstance(self.min_ratio, (int, float, np.number)):
      raise TypeError(f'Constraint(min_ratio={self.min_ratio!r}): give a number in [0, 1].')
    if self.min_channels < 1:
      raise ValueError(
        f'min_channels={self.min_channels}: must be >= 1 (a group is never emptied).'
      )
    if not 0.0 <= self.min_ratio <= 1.0:
      raise ValueError(f'min_ratio={self.min_ratio}: must be in [0, 1].')
    if not isinstance(self.allow_approximate, bool):
      raise TypeError(f'allow_approximate={self.allow_approximate!r}: give True or False.')
    if self.round_to < 1:
      raise ValueError(f'round_to={self.round_to}: must be >= 1 (1 disables rounding).')
    if isinstance(self.locked, str) or not isinstance(self.locked, Sequence):
      raise TypeError(
        f'locked={self.locked!r}: give a sequence of regexes, e.g. '
        f"('head',), not a {type(self.locked).__name__}."
      )
    for i, pattern in enumerate(self.locked):
      if not isinstance(pattern, str):
        raise TypeError(f'locked[{i}]={pattern!r}: each entry must be a regex string.')
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(
          f'locked[{i}]={pattern!r} is not a valid regex ({e}); escape special '
          'characters with re.escape.'
        ) from None

  def min_keep(self, size: int) -> int:
    return min(size, max(self.min_channels, math.ceil(self.min_ratio * size - 1e-9)))

  def allowed_keeps(self, size: int) -> np.ndarray:
    """Ascending kept counts this constraint allows for a group of `size`."""
    low = self.min_keep(size)
    keeps = [k for k in range(self.round_to, size, self.round_to) if k >= low]
    return np.asarray(keeps + [size], np.int64)

  def is_locked(self, group: Any) -> bool:
    if getattr(group, 'approximate', False) and not self.allow_approximate:
      return True
    return any(re.search(p, m.leaf) for p in self.locked for m in group.members)

  def keep_up(self, size: int, keep: int) -> int:
    """The smallest allowed kept count >= `keep`: never removes more than asked."""
    keeps = self.allowed_keeps(size)
    return int(keeps[keeps >= keep].min())

  def nearest_keep(self, size: int, keep: float) -> int:
    """The allowed kept count nearest to `keep` (ties keep more)."""
    keeps = self.allowed_keeps(size)
    return int(keeps[np.argmin(np.abs(keeps - keep) - 1e-9 * keeps)])

  def most_removal(self, size: int, removal: int) -> int:
    """The largest allowed removal not above `removal`."""
    removals = size - self.allowed_keeps(size)
    return int(removals[removals <= removal].max())
