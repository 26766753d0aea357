"""A pruning plan (which channels of which group go) and the per-group constraints."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Plan:
  """Channels to remove, per channel group.

  Attributes:
    removed: `{group id: sorted int array of removed channel indices}`; groups
      not listed keep all their channels.
    sizes: `{group id: group size}` for every group of the graph.
  """
  removed: Mapping[int, np.ndarray]
  sizes: Mapping[int, int]

  def kept(self, group_id: int) -> np.ndarray:
    """Sorted indices of the channels that stay in a group."""
    keep = np.ones(self.sizes[group_id], bool)
    keep[self.removed.get(group_id, np.zeros(0, int))] = False
    return np.flatnonzero(keep)

  @property
  def num_removed(self) -> int:
    return int(sum(len(r) for r in self.removed.values()))

  def summary(self) -> str:
    """One line per group that loses channels: `group 3: 64 -> 32`."""
    lines = [f'group {gid}: {self.sizes[gid]} -> {self.sizes[gid] - len(r)}'
             for gid, r in sorted(self.removed.items()) if len(r)]
    total = sum(self.sizes.values())
    lines.append(f'removed {self.num_removed} of {total} channels')
    return '\n'.join(lines)


def make_plan(graph: Any, removed: Mapping[int, Sequence[int]]) -> Plan:
  """Builds a checked Plan from `{group id: channel indices to remove}`.

  Raises:
    ValueError: for an unknown or unprunable group, an index out of range, or a
      plan that would empty a group.
  """
  groups = {g.id: g for g in graph.groups}
  out = {}
  for gid, channels in removed.items():
    if gid not in groups:
      raise ValueError(f'plan: group {gid} does not exist (the graph has ids {sorted(groups)}).')
    group = groups[gid]
    channels = np.unique(np.asarray(channels, dtype=np.int64))
    if channels.size == 0:
      continue
    if not group.prunable:
      raise ValueError(f'plan: group {gid} is not prunable ({group.reason}); leave it out.')
    if channels[0] < 0 or channels[-1] >= group.size:
      raise ValueError(f'plan: group {gid} has channels 0..{group.size - 1}, got '
                       f'{channels.min()}..{channels.max()}.')
    if channels.size >= group.size:
      raise ValueError(f'plan: removing all {group.size} channels of group {gid} would '
                       'empty it; keep at least one.')
    out[gid] = channels
  return Plan(removed=out, sizes={g.id: g.size for g in graph.groups})


@dataclasses.dataclass(frozen=True)
class Constraint:
  """Limits every selector respects (ENOT's channels selector constraint).

  Attributes:
    min_channels: keep at least this many channels per group (capped at its size).
    min_ratio: keep at least this fraction of each group.
    round_to: the kept count is a multiple of this (8 suits accelerators), or
      the whole group.
    locked: regexes; a group is left alone when any member leaf name matches.
  """
  min_channels: int = 1
  min_ratio: float = 0.0
  round_to: int = 1
  locked: Sequence[str] = ()

  def __post_init__(self):
    if self.min_channels < 1:
      raise ValueError(f'min_channels={self.min_channels}: must be >= 1 (a group is never '
                       'emptied).')
    if not 0.0 <= self.min_ratio <= 1.0:
      raise ValueError(f'min_ratio={self.min_ratio}: must be in [0, 1].')
    if self.round_to < 1:
      raise ValueError(f'round_to={self.round_to}: must be >= 1 (1 disables rounding).')
    for pattern in self.locked:
      re.compile(pattern)

  def min_keep(self, size: int) -> int:
    return min(size, max(self.min_channels, math.ceil(self.min_ratio * size - 1e-9)))

  def allowed_keeps(self, size: int) -> np.ndarray:
    """Ascending kept counts this constraint allows for a group of `size`."""
    low = self.min_keep(size)
    keeps = [k for k in range(self.round_to, size, self.round_to) if k >= low]
    return np.asarray(keeps + [size], np.int64)

  def is_locked(self, group: Any) -> bool:
    return any(re.search(p, m.leaf) for p in self.locked for m in group.members)

  def nearest_keep(self, size: int, keep: float) -> int:
    """The allowed kept count nearest to `keep` (ties keep more)."""
    keeps = self.allowed_keeps(size)
    return int(keeps[np.argmin(np.abs(keeps - keep) - 1e-9 * keeps)])

  def most_removal(self, size: int, removal: int) -> int:
    """The largest allowed removal not above `removal`."""
    removals = size - self.allowed_keeps(size)
    return int(removals[removals <= removal].max())
