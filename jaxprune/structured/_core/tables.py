"""Text reports of a DependencyGraph (the tabulate helpers)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from jaxprune.structured._core.graph import DependencyGraph

_MAX_MEMBERS = 4


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
  lines = [
    '  '.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
  ]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def _members(group, limit: int = _MAX_MEMBERS) -> str:
  """Members as 'leaf:axis', kernels first (they say most about where a group is)."""
  shown = sorted(group.members, key=lambda m: not m.leaf.endswith('kernel'))
  text = ', '.join(
    f'{m.leaf}:{m.axis}' + (f'(x{m.indices.shape[1]})' if m.indices.shape[1] > 1 else '')
    for m in shown[:limit]
  )
  if len(group.members) > limit:
    text += f', ... (+{len(group.members) - limit})'
  return text or '-'


def _flops(value: float) -> str:
  return f'{value:.3g}'


def _reason_kind(reason: str) -> str:
  """The reason without its particulars (which input, which axis, which shape)."""
  for prefix in ('reaches model input', 'reaches model output', 'reshape mixes axes'):
    if reason.startswith(prefix):
      return prefix
  return reason


def summary(graph: DependencyGraph) -> str:
  """Groups, channels, prunable share, FLOPs, blocked primitives, unread
  variables, prunable groups."""
  groups = graph.groups
  prunable = [g for g in groups if g.prunable]
  channels = sum(g.size for g in groups)
  pruned_channels = sum(g.size for g in prunable)
  share = 100.0 * pruned_channels / channels if channels else 0.0
  kinds = collections.Counter(_reason_kind(g.reason) for g in groups if not g.prunable)
  blocked = ', '.join(f'{k} ({v} axes)' for k, v in sorted(graph.blocked_primitives.items()))
  lines = [
    f'{len(groups)} groups, {channels} channels; prunable: {len(prunable)} groups, '
    f'{pruned_channels} channels ({share:.1f}%)',
    f'FLOPs (dot_general + conv): {_flops(graph.total_flops)}',
    'unprunable: ' + (', '.join(f'{k}: {v}' for k, v in sorted(kinds.items())) or 'none'),
    f'blocked primitives: {blocked or "none"}',
  ]
  lost = _lost(graph)
  if lost:
    lines.append(lost)
  if graph.unread:
    names = ', '.join(graph.unread[:_MAX_MEMBERS])
    more = len(graph.unread) - _MAX_MEMBERS
    lines.append(
      f'unread variables: {names}'
      + (f', ... (+{more})' if more > 0 else '')
      + ' (never read by the traced function: not prunable)'
    )
  if graph.norms is not None:
    lines.append(_norms_line(graph))
  if prunable and graph.norms is None:
    lines.append('')
    lines.append(
      _table(
        ('group', 'size', 'FLOPs/channel', 'members'),
        [(g.id, g.size, _flops(g.flops_per_channel), _members(g, 2)) for g in prunable],
      )
    )
  elif prunable:
    lines.append('')
    lines.append(
      _table(
        ('group', 'size', 'kind', 'FLOPs/channel', 'members'),
        [
          (
            g.id,
            g.size,
            g.kind + (' (approximate)' if g.approximate else ''),
            _flops(g.flops_per_channel),
            _members(g, 2),
          )
          for g in prunable
        ],
      )
    )
  return '\n'.join(lines)


def _lost(graph: DependencyGraph) -> str:
  """The weight axes a rule blocked (not a model input or output): what pruning lost."""
  lost = [
    g
    for g in graph.groups
    if not g.prunable
    and g.members
    and not g.reason.startswith(('reaches model input', 'reaches model output'))
  ]
  if not lost:
    return ''
  shown = '; '.join(f'{_members(g, 2)} ({g.reason})' for g in lost[:_MAX_MEMBERS])
  more = f'; ... (+{len(lost) - _MAX_MEMBERS})' if len(lost) > _MAX_MEMBERS else ''
  return f'weight axes blocked by a rule: {shown}{more} (all: graph.unprunable_table())'


def _norms_line(graph: DependencyGraph) -> str:
  width = [g for g in graph.groups if g.prunable and g.kind == 'width']
  exact = [g.id for g in width if not g.approximate]
  approximate = [g.id for g in width if g.approximate]
  return (
    f'norms={graph.norms!r}: {len(width)} width group(s) through norms; exact: '
    f'{exact or "none"}; approximate (selected only with '
    f'Constraint(allow_approximate=True)): {approximate or "none"}'
  )


def group_table(graph: DependencyGraph, group_id: int) -> str:
  """Members of one group: leaf, axis, positions per channel, channel 0's positions."""
  if not 0 <= group_id < len(graph.groups):
    raise ValueError(
      f'group_id={group_id} is out of range; the graph has '
      f'{len(graph.groups)} groups (0..{len(graph.groups) - 1})'
    )
  group = graph.groups[group_id]
  status = 'prunable' if group.prunable else f'not prunable: {group.reason}'
  if group.prunable and group.approximate:
    status += ' (approximate: the norm statistics change)'
  head = (
    f'group {group.id}: {group.size} channels, {status}, '
    f'{_flops(group.flops_per_channel)} FLOPs/channel'
  )
  rows = []
  for m in group.members:
    first = m.indices[0][:6].tolist()
    rows.append(
      (
        m.leaf,
        m.axis,
        graph.leaf_shapes[m.leaf][m.axis],
        m.indices.shape[1],
        ' '.join(map(str, first)) + (' ...' if m.indices.shape[1] > 6 else ''),
      )
    )
  if not rows:
    return head + '\n(no variables leaf in this group)'
  return (
    head + '\n' + _table(('leaf', 'axis', 'axis size', 'positions/channel', 'channel 0 at'), rows)
  )


def leaf_table(graph: DependencyGraph, leaf_name: str) -> str:
  """The groups that own each axis of one variables leaf."""
  if leaf_name not in graph.leaf_shapes:
    raise ValueError(
      f'leaf_name={leaf_name!r} is not a variables leaf; known leaves '
      f'are e.g. {sorted(graph.leaf_shapes)[:5]}'
    )
  shape = graph.leaf_shapes[leaf_name]
  axes = graph.leaf_axes.get(leaf_name, {})
  rows = []
  for axis, size in enumerate(shape):
    parts = axes.get(axis, [])
    if not parts:
      rows.append((axis, size, '-', 'size 1: never changes' if size == 1 else '-'))
      continue
    owners = ', '.join(
      f'{p.group_id} ({graph.groups[p.group_id].size}'
      + (f' x{p.indices.shape[1]}' if p.indices.shape[1] > 1 else '')
      + ')'
      for p in parts
    )
    status = '; '.join(
      'prunable' if graph.groups[p.group_id].prunable else graph.groups[p.group_id].reason
      for p in parts
    )
    rows.append((axis, size, owners, status))
  return f'{leaf_name} {tuple(shape)}\n' + _table(('axis', 'size', 'groups', 'status'), rows)


def unprunable_table(graph: DependencyGraph) -> str:
  """Every unprunable group with its reason."""
  rows = [(g.id, g.size, g.reason, _members(g, 2)) for g in graph.groups if not g.prunable]
  return _table(('group', 'size', 'reason', 'members'), rows)
