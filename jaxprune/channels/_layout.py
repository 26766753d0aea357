"""Where each channel of a traced model lives in the params the optimizer updates.

`trace` names the leaves of the variables it was given ('params/Conv_0/kernel',
'batch_stats/BatchNorm_0/mean'); the pruning transform sees only the params
('Conv_0/kernel'). `ChannelLayout` maps one onto the other once, from static shapes:
which params leaves get masks, which of their axes each channel group owns,
and which kept counts the `Constraint` allows. Everything the mask update does
inside jit reads these tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune.structured import Constraint, DependencyGraph
from jaxprune.structured._shared import is_weight


@dataclasses.dataclass(frozen=True)
class Slice:
  """The positions one group's channels own on one axis of one pruned leaf.

  Attributes:
    leaf: the leaf's position among the pruned leaves.
    axis: the axis.
    indices: int array (group size, k): row c holds the positions of channel c.
    owner: int array (axis size,): the channel owning each position, -1 for
      positions of other groups.
  """

  leaf: int
  axis: int
  indices: np.ndarray
  owner: np.ndarray


@dataclasses.dataclass(frozen=True)
class Group:
  """A channel group the transform prunes.

  Attributes:
    id: its id in the graph.
    label: a readable, unique name: a member 'leaf:axis', the producer's
      kernel output axis when there is one (e.g. 'Conv_0/kernel:3').
    size: number of channels.
    slices: its members on the pruned leaves (every weight member).
    keeps: int array (size + 1,): for each count of channels the threshold
      keeps, the count the constraint allows (the nearest one, ties keep more).
  """

  id: int
  label: str
  size: int
  slices: tuple[Slice, ...]
  keeps: np.ndarray


@dataclasses.dataclass(frozen=True)
class ChannelLayout:
  """The static tables of channel masks over the params.

  Attributes:
    names: names of every params leaf, in flattening order.
    shapes: their shapes.
    pruned: indices (into `names`) of the leaves that get masks.
    groups: the groups that are pruned.
    skipped: `{group id: reason}` for prunable groups that are not.
  """

  names: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  pruned: tuple[int, ...]
  groups: tuple[Group, ...]
  skipped: dict[int, str]

  def check_params(self, params_names: list[str], params_shapes: list[tuple[int, ...]]) -> None:
    """ValueError unless the params are those the layout was made for."""
    if list(self.names) != params_names:
      extra = sorted(set(params_names) - set(self.names))[:3]
      missing = sorted(set(self.names) - set(params_names))[:3]
      raise ValueError(
        f'ChannelRule: the params given to init are not the traced params (not in the '
        f'graph: {extra}; missing: {missing}). Trace the model with the variables whose '
        "params the optimizer updates, and pass params= the key of those params ('params' "
        'for Flax Linen) or None for the whole variables.'
      )
    for name, shape, want in zip(params_names, params_shapes, self.shapes, strict=True):
      if tuple(shape) != tuple(want):
        raise ValueError(
          f'ChannelRule: params leaf {name!r} has shape {tuple(shape)}, traced '
          f'as {tuple(want)}; trace the model with these params.'
        )


def default_params_key(graph: DependencyGraph) -> str | None:
  """'params' when the graph's variables are Flax Linen variables, else None (all)."""
  return 'params' if any(n.startswith('params/') for n in graph.leaf_names) else None


def _params_names(graph: DependencyGraph, params_key: str | None) -> dict[str, str]:
  """{graph leaf name: params leaf name} for the leaves the optimizer updates."""
  if params_key is None:
    return {name: name for name in graph.leaf_names}
  prefix = params_key + '/'
  names = {name: name[len(prefix) :] for name in graph.leaf_names if name.startswith(prefix)}
  if not names:
    tops = sorted({name.split('/', 1)[0] for name in graph.leaf_names})
    raise ValueError(
      f'ChannelRule: params={params_key!r} names no part of the traced '
      f'variables (their top-level keys: {tops}); give one of them, or None '
      'when the optimizer updates the whole variables.'
    )
  return names


def _owner(indices: np.ndarray, axis_size: int, where: str) -> np.ndarray:
  owner = np.full(axis_size, -1, np.int64)
  for channel, positions in enumerate(np.asarray(indices)):
    if np.any(owner[positions] >= 0):
      raise ValueError(
        f'ChannelRule: {where}: a position is owned by two channels of one '
        'group; this group cannot be masked channel by channel.'
      )
    owner[positions] = channel
  return owner


def _label(
  graph_group: Any, names: dict[str, str], shapes: dict[str, tuple[int, ...]], taken: set[str]
) -> str:
  members = sorted(
    ((names[m.leaf], m.axis) for m in graph_group.members if m.leaf in names),
    key=lambda m: (m[1] != len(shapes[m[0]]) - 1 or len(shapes[m[0]]) < 2, m),
  )
  for leaf, axis in members:
    label = f'{leaf}:{axis}'
    if label not in taken:
      return label
  return f'group {graph_group.id}'


def build(
  graph: DependencyGraph, params_key: str | None, constraint: Constraint, dtypes: dict[str, Any]
) -> ChannelLayout:
  """The layout of the prunable, unlocked groups of `graph` over its params.

  Args:
    graph: from `jaxprune.structured.trace`.
    params_key: the variables key of the params ('params' for Linen), or None.
    constraint: min channels, round_to and locked groups, as for `select`.
    dtypes: graph leaf name -> dtype.

  Returns:
    The layout; groups whose weights are not all in the params (or not all
    floating point) are skipped with a reason, and a warning names them.
  """
  names = _params_names(graph, params_key)
  shapes = {names[n]: graph.leaf_shapes[n] for n in names}
  candidates, skipped = [], {}
  for group in graph.groups:
    if not group.prunable or constraint.is_locked(group):
      continue
    if constraint.min_keep(group.size) >= group.size:
      continue
    weights = [m for m in group.members if is_weight(m.leaf)]
    outside = sorted({m.leaf for m in weights if m.leaf not in names})
    not_float = sorted(
      {
        m.leaf
        for m in weights
        if m.leaf in names and not jnp.issubdtype(np.dtype(dtypes[m.leaf]), jnp.floating)
      }
    )
    if outside:
      skipped[group.id] = f'weights outside the params: {outside}'
    elif not_float:
      skipped[group.id] = f'weights that are not floating point: {not_float}'
    elif not weights:
      skipped[group.id] = 'no weights'
    else:
      candidates.append((group, weights))
  pruned_names = sorted(
    {names[m.leaf] for _, weights in candidates for m in weights}, key=list(names.values()).index
  )
  position = {name: i for i, name in enumerate(pruned_names)}
  groups, taken = [], set()
  for group, weights in candidates:
    slices = tuple(
      Slice(
        position[names[m.leaf]],
        m.axis,
        np.asarray(m.indices),
        _owner(m.indices, shapes[names[m.leaf]][m.axis], f'{m.leaf}:{m.axis}'),
      )
      for m in weights
    )
    label = _label(group, names, shapes, taken)
    taken.add(label)
    keeps = np.asarray(
      [constraint.nearest_keep(group.size, max(n, 1)) for n in range(group.size + 1)], np.int32
    )
    groups.append(Group(group.id, label, group.size, slices, keeps))
  if skipped:
    warnings_lib.warn(
      'ChannelRule: these prunable groups are not pruned: '
      + '; '.join(f'group {gid} ({why})' for gid, why in skipped.items())
    )
  all_names = tuple(names.values())
  return ChannelLayout(
    all_names,
    tuple(shapes[n] for n in all_names),
    tuple(all_names.index(n) for n in pruned_names),
    tuple(groups),
    skipped,
  )
