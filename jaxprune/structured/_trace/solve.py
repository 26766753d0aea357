"""From the walker's edges, blocks and merged positions to channel groups.

1. Connected components of the id graph: each component is one channel, or a
   merged position when it was recorded as derived from factor ids.
2. Merged positions that were recorded twice (flatten then unflatten) tie
   their factors pairwise; repeat until nothing changes. A merged position
   in the same channel as one of its factors is that channel when its other
   factors are blocked (they always survive), and blocks otherwise.
3. Each tensor position is owned by its channel, or by all base factors of
   its merged position.
4. A group is the set of channels that occupy exactly the same tensor axes,
   the same number of times, with the same block reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from jaxprune.structured._core.graph import AxisPart, ChannelGroup, DependencyGraph, Member
from jaxprune.structured._primitives import cost

_MAX_ROUNDS = 16
_CONFLICT = 'incompatible merges of this axis (reshape / grouped conv)'


def _components(count: int, edges: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
  if not edges:
    return np.arange(count)
  a = np.concatenate([e[0] for e in edges])
  b = np.concatenate([e[1] for e in edges])
  graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(count, count))
  return connected_components(graph, directed=False)[1]


def _first_rows(classes: np.ndarray) -> np.ndarray:
  """For each row, the index of the first row with the same class."""
  uniq, first = np.unique(classes, return_index=True)
  return first[np.searchsorted(uniq, classes)]


def _settle_merges(
  walker,
) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, str]]]:
  """Labels, and per arity (derived classes, their factor classes), and extra blocks."""
  by_arity: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
  for ids, factors in walker.derived:
    by_arity.setdefault(factors.shape[1], []).append((ids, factors))
  records = {
    f: (np.concatenate([r[0] for r in rs]), np.concatenate([r[1] for r in rs]))
    for f, rs in by_arity.items()
  }
  edges = list(walker.edges)
  for _ in range(_MAX_ROUNDS):
    labels = _components(walker.count, edges)
    new_edges = []
    for ids, factors in records.values():
      rep = factors[_first_rows(labels[ids])]
      differ = labels[rep] != labels[factors]
      if differ.any():
        new_edges.append((rep[differ], factors[differ]))
    if not new_edges:
      break
    edges.extend(new_edges)
  blocked = np.zeros(walker.count, dtype=bool)
  if walker.blocks:
    blocked[labels[np.concatenate([ids for ids, _ in walker.blocks])]] = True
  tables, blocks, seen = {}, [], np.zeros(0, dtype=np.int64)
  for arity in sorted(records):
    ids, factors = records[arity]
    classes = labels[ids]
    first = np.unique(classes, return_index=True)[1]
    cls, fac = classes[first], labels[factors[first]]
    own = fac == cls[:, None]
    # A position derived from its own channel and blocked factors only (the
    # pairs of interleaved rotary embeddings, stacked along a new axis and
    # merged back into the head dim they came from) is that channel itself.
    plain = own.any(axis=1) & (own | blocked[fac]).all(axis=1)
    cls, fac, own = cls[~plain], fac[~plain], own[~plain]
    clash = np.isin(cls, seen) | own.any(axis=1)
    if clash.any():
      blocks.append((ids[np.isin(classes, cls[clash])], _CONFLICT))
    tables[arity] = (cls[~clash], fac[~clash])
    seen = np.concatenate([seen, cls])
  return labels, tables, blocks


def _ownership(labels: np.ndarray, tables) -> tuple[np.ndarray, np.ndarray]:
  """(element, owner channel) pairs: merged positions expand to base factors."""
  elems, owners = np.arange(len(labels)), labels.copy()
  done_e, done_o = [], []
  for _ in range(_MAX_ROUNDS):
    pending_e, pending_o = [], []
    keep = np.ones(len(owners), dtype=bool)
    for cls, fac in tables.values():
      if not len(cls):
        continue
      where = np.searchsorted(cls, owners)
      hit = (where < len(cls)) & (cls[np.minimum(where, len(cls) - 1)] == owners)
      keep &= ~hit
      rows = fac[where[hit]]
      pending_e.append(np.repeat(elems[hit], rows.shape[1]))
      pending_o.append(rows.ravel())
    done_e.append(elems[keep])
    done_o.append(owners[keep])
    if not pending_e or not sum(len(p) for p in pending_e):
      break
    elems, owners = np.concatenate(pending_e), np.concatenate(pending_o)
  return np.concatenate(done_e), np.concatenate(done_o)


def _reason_priority(reason: str) -> int:
  for rank, prefix in enumerate(
    ('blocked by primitive', 'reaches model input', 'reaches model output')
  ):
    if reason.startswith(prefix):
      return rank
  return 3


def _class_reasons(
  count: int, blocks, own_e: np.ndarray, own_o: np.ndarray, n_classes: int
) -> tuple[np.ndarray, list[str]]:
  """Per channel class, the index of its most telling block reason, or -1."""
  reasons = sorted({r for _, r in blocks}, key=lambda r: (_reason_priority(r), r))
  code_of = {r: i for i, r in enumerate(reasons)}
  none = len(reasons)
  elem_code = np.full(count, none, dtype=np.int64)
  for ids, reason in blocks:
    np.minimum.at(elem_code, ids, code_of[reason])
  class_code = np.full(n_classes, none, dtype=np.int64)
  np.minimum.at(class_code, own_o, elem_code[own_e])
  class_code[class_code == none] = -1
  return class_code, reasons


def _group_channels(own_o, node, pos, class_code, node_keys, n_classes, count):
  """Channels -> groups, ordered; returns (class_group, class_rank, sizes, first class)."""
  n_nodes = len(node_keys)
  # Signature of a channel: the multiset of axes it occupies, and its reason.
  pair, counts = np.unique(own_o.astype(np.int64) * n_nodes + node, return_counts=True)
  pair_cls, pair_node = pair // n_nodes, pair % n_nodes
  weights = np.random.default_rng(0).integers(1, 2**63, size=n_nodes + 1, dtype=np.uint64)
  term = weights[pair_node] * (2 * counts.astype(np.uint64) + 1)
  starts = np.flatnonzero(np.r_[True, pair_cls[1:] != pair_cls[:-1]])
  classes = pair_cls[starts]
  signature = np.add.reduceat(term, starts)
  signature = signature + weights[n_nodes] * (class_code[classes] + 2).astype(np.uint64)
  _, group_of = np.unique(signature, return_inverse=True)
  # Order channels within a group by their first position on the group's
  # canonical axis (its first tensor axis, preferring real tensors over
  # factors), and groups by where that axis comes in the jaxpr.
  is_var_node = np.array([k is not None for k in node_keys])
  canon = np.where(is_var_node[pair_node], pair_node, n_nodes + pair_node)
  canon_node = np.minimum.reduceat(canon, starts) % n_nodes
  canon_of_class = np.full(n_classes, -1)
  canon_of_class[classes] = canon_node
  on_canon = canon_of_class[own_o] == node
  first_pos = np.full(n_classes, np.iinfo(np.int64).max)
  np.minimum.at(first_pos, own_o[on_canon], pos[on_canon])
  where = canon_node * (count + 1) + first_pos[classes]
  group_where = np.full(int(group_of.max()) + 1 if len(group_of) else 0, np.iinfo(np.int64).max)
  np.minimum.at(group_where, group_of, where)
  renumber = np.empty_like(group_where)
  renumber[np.argsort(group_where, kind='stable')] = np.arange(len(group_where))
  group_of = renumber[group_of]
  order = np.lexsort((first_pos[classes], group_of))
  class_group = np.full(n_classes, -1)
  class_group[classes] = group_of
  sorted_groups = group_of[order]
  group_start = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
  sizes = np.diff(np.r_[group_start, len(order)])
  class_rank = np.zeros(n_classes, dtype=np.int64)
  class_rank[classes[order]] = np.arange(len(order)) - np.repeat(group_start, sizes)
  return class_group, class_rank, sizes, classes[order[group_start]]


def _axis_parts(own_o, node, pos, class_group, class_rank, sizes, node_keys, leaf_of, leaf_vars):
  """Returns (var_axes, leaf_axes, members per group, ids of the groups some
  value computed by an equation carries) from the ownership table."""
  entries = np.lexsort((pos, class_rank[own_o], class_group[own_o], node))
  e_node, e_group, e_pos = node[entries], class_group[own_o][entries], pos[entries]
  cut = np.flatnonzero(np.r_[True, (e_node[1:] != e_node[:-1]) | (e_group[1:] != e_group[:-1])])
  var_axes: dict[Any, dict[int, list[AxisPart]]] = {}
  leaf_axes: dict[str, dict[int, list[AxisPart]]] = {}
  members: list[list[Member]] = [[] for _ in sizes]
  carried = set()
  for start, stop in zip(cut, np.r_[cut[1:], len(entries)], strict=True):
    key = node_keys[e_node[start]]
    if key is None:
      continue
    gid = int(e_group[start])
    indices = e_pos[start:stop].reshape(int(sizes[gid]), -1)
    (scope, var), axis = key
    if (scope, id(var)) not in leaf_vars:
      carried.add(gid)
    part = AxisPart(gid, indices)
    var_axes.setdefault((scope, var), {}).setdefault(axis, []).append(part)
    if scope == () and id(var) in leaf_of:
      name = leaf_of[id(var)]
      leaf_axes.setdefault(name, {}).setdefault(axis, []).append(part)
      members[gid].append(Member(name, axis, indices))
  return var_axes, leaf_axes, members, carried


_UNREAD = 'never read by the traced function'


def build_graph(
  walker,
  *,
  entries,
  leaf_names,
  leaf_shapes,
  unread,
  variables_tree,
  variables_avals,
  blocked_primitives,
  warnings,
  norms,
) -> DependencyGraph:
  """Groups the walker's channels; see the module docstring."""
  labels, tables, extra_blocks = _settle_merges(walker)
  own_e, own_o = _ownership(labels, tables)
  n_classes = int(labels.max()) + 1 if len(labels) else 0
  class_code, reasons = _class_reasons(
    walker.count, walker.blocks + extra_blocks, own_e, own_o, n_classes
  )
  bases = np.asarray(walker.node_bases, dtype=np.int64)
  node = np.searchsorted(bases, own_e, side='right') - 1
  pos = own_e - bases[node]
  class_group, class_rank, sizes, first_class = _group_channels(
    own_o, node, pos, class_code, walker.node_keys, n_classes, walker.count
  )
  first = entries[0].closed_jaxpr.jaxpr
  leaf_of = {id(v): n for v, n in zip(first.invars, leaf_names, strict=False)}
  leaf_vars = {
    (e.scope, id(v)) for e in entries for v in e.closed_jaxpr.jaxpr.invars[: len(leaf_names)]
  }
  var_axes, leaf_axes, members, carried = _axis_parts(
    own_o, node, pos, class_group, class_rank, sizes, walker.node_keys, leaf_of, leaf_vars
  )
  group_flops, total_flops = cost.count(first, var_axes, len(sizes), entries[0].scope)
  unread_set = set(unread)
  groups = []
  for gid, size in enumerate(sizes):
    code = class_code[first_class[gid]]
    reason = reasons[code] if code >= 0 else None
    if reason is None and not members[gid]:
      reason = 'no parameters'
    # Unread leaves, and positions of read leaves that no equation takes (rows
    # of a position table beyond the traced length): removing them saves
    # nothing, so a selector must not spend its budget on them.
    if reason is None and (gid not in carried or all(m.leaf in unread_set for m in members[gid])):
      reason = _UNREAD
    groups.append(
      ChannelGroup(
        id=gid,
        size=int(size),
        members=members[gid],
        prunable=reason is None,
        reason=reason,
        flops_per_channel=float(group_flops[gid]),
      )
    )
  return DependencyGraph(
    groups=groups,
    leaf_names=leaf_names,
    leaf_shapes=leaf_shapes,
    blocked_primitives=blocked_primitives,
    total_flops=total_flops,
    entries=entries,
    var_axes=var_axes,
    leaf_axes=leaf_axes,
    unread=list(unread),
    proxied=walker.proxied,
    notes=walker.notes,
    variables_tree=variables_tree,
    variables_avals=variables_avals,
    warnings=warnings,
    norms=norms,
    norm_sums=sorted({(r[0], r[1]) for r in walker.reductions}),
  )
