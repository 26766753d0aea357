"""Group identity that survives a new trace: what a group ties, not its index.

Tracing the same model at another batch size, sequence length or from
another entry point numbers its groups afresh. A group is identified by its
members: each variables leaf axis it owns and the positions each channel owns
there (for strided and merged members, the whole position pattern). Channels
are put in a canonical order by where they sit on the group's first member, so
channel c of a plan finds the same channel in any trace.

A plan made on one trace applies to another by `translate`; a group it cannot
find, or finds unprunable, is an error naming the group, never a guess between
two groups of equal size.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from jaxprune.structured._core.graph import DependencyGraph


@dataclasses.dataclass(frozen=True)
class GroupKey:
  """What identifies a group across traces.

  Attributes:
    signature: per member (sorted): leaf name, axis, positions per channel and
      a digest of the position pattern.
    canonical: int array `(size,)`: the rank of each channel when channels
      are sorted by their first position on the first member.
    label: a readable description ('params/conv1/kernel:3 (+5 members), 64 channels').
  """

  signature: tuple
  canonical: np.ndarray
  label: str

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, GroupKey):
      return NotImplemented
    return self.signature == other.signature

  def __hash__(self) -> int:
    return hash(self.signature)


def group_key(group: Any) -> GroupKey | None:
  """The key of a group, or None for a group without variables leaves."""
  if not group.members:
    return None
  members = sorted(group.members, key=lambda m: (m.leaf, m.axis))
  parts = []
  for m in members:
    rows = np.asarray(m.indices, np.int64)
    ordered = rows[np.argsort(rows[:, 0], kind='stable')]
    parts.append((m.leaf, m.axis, rows.shape[1], hashlib.sha1(ordered.tobytes()).hexdigest()))
  anchor = np.asarray(members[0].indices)[:, 0]
  canonical = np.empty(len(anchor), np.int64)
  canonical[np.argsort(anchor, kind='stable')] = np.arange(len(anchor))
  more = f' (+{len(members) - 1} members)' if len(members) > 1 else ''
  label = f'{members[0].leaf}:{members[0].axis}{more}, {group.size} channels'
  return GroupKey(tuple(parts), canonical, label)


def index(graph: DependencyGraph) -> dict[tuple, Any]:
  """`{signature: group}` of a graph's groups with variables leaves (cached on the graph)."""
  cached = getattr(graph, '_identity_index', None)
  if cached is not None and cached[0] is graph.groups:
    return cached[1]
  found = {}
  for group in graph.groups:
    key = group_key(group)
    if key is not None:
      found.setdefault(key.signature, []).append(group)
  table = {sig: groups[0] for sig, groups in found.items() if len(groups) == 1}
  try:
    object.__setattr__(graph, '_identity_index', (graph.groups, table))
  except AttributeError:  # a graph-like namespace that takes no new attributes
    pass
  return table


def translate(
  removed: dict[int, np.ndarray], keys: dict[int, GroupKey], graph: DependencyGraph
) -> dict[int, np.ndarray]:
  """Maps `{group id: channels}` of another trace onto `graph` by group identity.

  Args:
    removed: channels to remove, by group id of the trace the keys come from.
    keys: that trace's key of each group in `removed`.
    graph: the graph to apply them to.

  Returns:
    `{group id in graph: channel indices}`.

  Groups that lose no channels are left out: they need not exist, or be prunable, in
  `graph`.

  Raises:
    ValueError: naming the group when it is not in `graph` or not prunable there.
  """
  table = index(graph)
  out = {}
  for gid, channels in removed.items():
    if not len(channels):  # a group that keeps every channel needs nothing of this trace
      continue
    key = keys[gid]
    group = table.get(key.signature)
    if group is None:
      raise ValueError(
        f'plan: group {gid} ({key.label}) is not a group of this trace: the traced function '
        'ties these channels differently here (another input shape or entry point). Make '
        'the plan on a trace of this function, or leave the group out.'
      )
    if not group.prunable:
      raise ValueError(
        f'plan: group {gid} ({key.label}) is group {group.id} of this trace, '
        f'which is not prunable ({group.reason}).'
      )
    rank_to_channel = np.argsort(group_key(group).canonical)
    out[group.id] = np.sort(rank_to_channel[key.canonical[np.asarray(channels, np.int64)]])
  return out
