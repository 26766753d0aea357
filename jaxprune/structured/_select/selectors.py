"""Selectors: which channels to remove, from importance scores and a target.

Three targets, as ENOT and Torch-Pruning users know them:

* uniform: the same ratio of channels leaves every prunable group;
* global: a ratio or count of all candidate channels, least important first
  across groups (scores are mean-normalised per group, so they compare);
* cost: a FLOPs target (fraction of the dense model's FLOPs) or any monotone
  cost such as a measured latency, reached greedily (global order, binary
  search on how many channels go) or by a knapsack over per-group kept counts.

Every selector respects a `Constraint` (minimum kept, rounding, locked groups)
and removes, within a group, its least important channels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.plan import Constraint, Plan, check_variables, make_plan
from jaxprune.structured._primitives import cost as cost_lib
from jaxprune.structured._select import importance as importance_lib
from jaxprune.structured._select import shortfall as shortfall_lib
from jaxprune.structured._select.targets import check_ratio, check_target

PyTree = Any


def _candidates(
  graph: DependencyGraph, scores: Mapping[int, np.ndarray], constraint: Constraint
) -> list:
  return [
    g
    for g in graph.groups
    if g.prunable
    and g.id in scores
    and not constraint.is_locked(g)
    and constraint.min_keep(g.size) < g.size
  ]


def _least_important(scores: np.ndarray, count: int) -> np.ndarray:
  """The `count` channels of lowest score, ascending: the first of a stable ascending
  sort, so among equal scores the lower index goes first. That is the library's second
  tie rule (`jaxprune._masks.ranking.lowest_k_stable`); structured selection has always used
  it, and its plans stay as they were. It runs on the host in numpy, inside the
  selectors' loops, so it does not call the jax version."""
  return np.sort(np.argsort(scores, kind='stable')[:count])


def _plan_from_counts(
  graph: DependencyGraph,
  scores: Mapping[int, np.ndarray],
  counts: Mapping[int, int],
  notes: tuple[str, ...] = (),
) -> Plan:
  plan = make_plan(
    graph, {gid: _least_important(scores[gid], n) for gid, n in counts.items() if n > 0}
  )
  return dataclasses.replace(plan, notes=notes) if notes else plan


def _rounding_notes(
  graph: DependencyGraph,
  asked: Mapping[int, int],
  counts: Mapping[int, int],
  constraint: Constraint,
) -> tuple[str, ...]:
  """One note per group where the constraint removed fewer channels than asked."""
  sizes = {g.id: g.size for g in graph.groups}
  changed = [
    f'group {gid}: {sizes[gid]} -> {sizes[gid] - counts[gid]}, not {sizes[gid] - n}'
    for gid, n in sorted(asked.items())
    if counts[gid] < n
  ]
  if not changed:
    return ()
  why = (
    f'kept counts rounded up to a multiple of round_to={constraint.round_to} (or the whole group)'
    if constraint.round_to > 1
    else 'min_channels / min_ratio keep more'
  )
  shown = '; '.join(changed[:6]) + (f'; ... (+{len(changed) - 6})' if len(changed) > 6 else '')
  return (
    f'{why}: {shown}'
    + (' (Constraint(round_to=1) removes what was asked)' if constraint.round_to > 1 else ''),
  )


def uniform(
  graph: DependencyGraph,
  scores: Mapping[int, np.ndarray],
  ratio: float | Mapping[str, float],
  constraint: Constraint | None = None,
) -> Plan:
  """Removes `ratio` of the channels of every prunable, unlocked group.

  The kept count is `size - floor(ratio * size)`, rounded up to a count the
  constraint allows, so no group loses more than `ratio`; the plan's notes
  name the groups where the constraint kept more. `ratio` may be a ratio per kind of group
  (`ChannelGroup.kind`), e.g. `{'heads': 0.25, 'channels': 0.3, 'width': 0.3}`;
  kinds it does not name keep every channel.
  """
  check_ratio(ratio)
  constraint = constraint or Constraint()
  counts, asked = {}, {}
  for g in _candidates(graph, scores, constraint):
    group_ratio = ratio.get(g.kind, 0.0) if isinstance(ratio, Mapping) else ratio
    asked[g.id] = int(np.floor(group_ratio * g.size + 1e-9))  # never more than the ratio
    counts[g.id] = g.size - constraint.keep_up(g.size, g.size - asked[g.id])
  plan = _plan_from_counts(graph, scores, counts, _rounding_notes(graph, asked, counts, constraint))
  positive = any(r > 0 for r in ratio.values()) if isinstance(ratio, Mapping) else ratio > 0
  if not positive:
    return plan
  shortfall = shortfall_lib.message(
    graph,
    _candidates(graph, scores, constraint),
    constraint,
    f'ratio={ratio!r}',
    plan.num_removed,
    sum(asked.values()),
  )
  return dataclasses.replace(plan, shortfall=shortfall)


class _GlobalOrder:
  """All candidate channels sorted by score; plans from a prefix of that order."""

  def __init__(self, graph, scores, constraint):
    self.graph, self.scores, self.constraint = graph, scores, constraint
    self.groups = _candidates(graph, scores, constraint)
    if self.groups:
      gids = np.concatenate([np.full(g.size, g.id) for g in self.groups])
      flat = np.concatenate([np.asarray(scores[g.id], np.float64) for g in self.groups])
      self.order_gids = gids[np.argsort(flat, kind='stable')]
    else:
      self.order_gids = np.zeros(0, np.int64)
    self.total = int(self.order_gids.size)

  def counts(self, k: int) -> dict[int, int]:
    ids, n = np.unique(self.order_gids[:k], return_counts=True)
    sizes = {g.id: g.size for g in self.groups}
    return {
      int(gid): self.constraint.most_removal(sizes[int(gid)], int(c))
      for gid, c in zip(ids, n, strict=True)
    }

  def plan(self, k: int) -> Plan:
    return _plan_from_counts(self.graph, self.scores, self.counts(k))

  def largest_prefix(self, ok: Callable[[Plan], bool]) -> Plan:
    """The plan of the longest prefix for which `ok(plan)` holds (true up to some k)."""
    lo, hi = 0, self.total
    while lo < hi:
      mid = (lo + hi + 1) // 2
      if ok(self.plan(mid)):
        lo = mid
      else:
        hi = mid - 1
    return self.plan(lo)

  def smallest_prefix(self, ok: Callable[[Plan], bool]) -> tuple[Plan, bool]:
    """The plan of the shortest prefix for which `ok(plan)` holds (monotone in k), and
    whether any does (else the plan of every candidate channel)."""
    lo, hi = 0, self.total
    if not ok(self.plan(hi)):
      warnings_lib.warn(
        'the target cannot be reached within the constraints; removing as many '
        'channels as they allow.'
      )
      return self.plan(hi), False
    while lo < hi:
      mid = (lo + hi) // 2
      if ok(self.plan(mid)):
        hi = mid
      else:
        lo = mid + 1
    return self.plan(lo), True


def global_(
  graph: DependencyGraph,
  scores: Mapping[int, np.ndarray],
  amount: float,
  constraint: Constraint | None = None,
) -> Plan:
  """Removes the least important channels network-wide.

  Args:
    graph: a DependencyGraph.
    scores: importance scores per group.
    amount: a fraction in (0, 1) of all candidate channels, or an int >= 1
      giving their number (ENOT's `n_channels_or_ratio`).
    constraint: per-group limits; the result never removes more than
      `amount` channels (rounding up kept counts may remove fewer; the plan's
      notes say so).

  Returns:
    The plan.
  """
  order = _GlobalOrder(graph, scores, constraint or Constraint())
  if isinstance(amount, (int, np.integer)) and amount >= 1:
    target = int(amount)
  elif 0.0 <= amount < 1.0:
    target = int(np.floor(amount * order.total + 1e-9))
  else:
    raise ValueError(f'amount={amount!r}: give a fraction in [0, 1) or a channel count >= 1.')
  plan = order.largest_prefix(lambda plan: plan.num_removed <= target)
  if order.plan(order.total).num_removed < target:
    warnings_lib.warn(
      f'the target ({target} channels) cannot be reached within the constraints; '
      'removing as many channels as they allow.'
    )
  if plan.num_removed < target:
    why = (
      f'round_to={order.constraint.round_to}' if order.constraint.round_to > 1 else 'the constraint'
    )
    plan = dataclasses.replace(
      plan,
      notes=(f'{why} removed {plan.num_removed} of the {target} channels asked for (never more)',),
    )
  if amount > 0:
    asked = f'amount={amount!r} ({target} of {order.total} candidate channels)'
    shortfall = shortfall_lib.message(
      graph, order.groups, order.constraint, asked, plan.num_removed, target
    )
    plan = dataclasses.replace(plan, shortfall=shortfall)
  return plan


def _knapsack(graph, scores, constraint, cost_fn, target, buckets=256):
  """Minimises lost importance s.t. linearised FLOPs saving >= budget; budget by bisection."""
  groups = _candidates(graph, scores, constraint)
  options = []  # per group: (removal counts, lost importance, linear saving)
  for g in groups:
    removals = g.size - constraint.allowed_keeps(g.size)
    lost = np.concatenate([[0.0], np.cumsum(np.sort(scores[g.id]))])[removals]
    options.append((removals, lost, removals * max(float(g.flops_per_channel), 0.0)))
  max_saving = sum(float(o[2].max()) for o in options) if options else 0.0
  if max_saving <= 0:
    return None
  unit = max_saving / buckets

  def solve(budget):
    need = int(np.ceil(budget / unit - 1e-9))
    states = np.arange(need + 1)
    best = np.where(states == 0, 0.0, np.inf)  # best[s]: least loss with saving >= s units
    choices = []
    for _, lost, saving in options:
      units = np.floor(saving / unit + 1e-9).astype(np.int64)
      new, arg = np.full(need + 1, np.inf), np.zeros(need + 1, np.int64)
      for j in range(len(lost)):
        cand = best[np.maximum(0, states - units[j])] + lost[j]
        better = cand < new
        new[better], arg[better] = cand[better], j
      best = new
      choices.append((arg, units))
    if not np.isfinite(best[need]):
      return None
    counts, s = {}, need
    for g, (removals, _, _), (arg, units) in reversed(
      list(zip(groups, options, choices, strict=True))
    ):
      j = int(arg[s])
      counts[g.id] = int(removals[j])
      s = max(0, s - int(units[j]))
    return _plan_from_counts(graph, scores, counts)

  lo, hi, found = 0.0, max_saving, None
  for _ in range(24):
    mid = (lo + hi) / 2
    plan = solve(mid)
    if plan is not None and cost_fn(plan) <= target:
      found, hi = plan, mid
    else:
      lo = mid
  return found


def by_cost(
  graph: DependencyGraph,
  scores: Mapping[int, np.ndarray],
  cost_fn: Callable[[Plan], float],
  target: float,
  constraint: Constraint | None = None,
  search: str = 'greedy',
) -> Plan:
  """Removes channels until `cost_fn(plan) <= target`.

  Args:
    graph: a DependencyGraph.
    scores: importance scores per group.
    cost_fn: cost of the model a plan gives (FLOPs, or a measured latency);
      must not grow when more channels go.
    target: the cost to reach, in `cost_fn`'s units.
    constraint: per-group limits.
    search: 'greedy' (least important first across groups; a binary search on
      how many go) or 'knapsack' (per-group kept counts that lose the least
      importance for a linearised FLOPs saving, tightened until the exact cost
      meets the target).

  Returns:
    The plan; with a warning, the most the constraints allow and a
    `shortfall` if the target is out of reach.
  """
  return _by_cost(
    graph,
    scores,
    cost_fn,
    target,
    constraint or Constraint(),
    search,
    f'the cost target {target:.4g}',
    lambda cost: f'leaves a cost of {cost:.4g}',
  )


def _by_cost(graph, scores, cost_fn, target, constraint, search, asked, reached_cost) -> Plan:
  """`by_cost`; `asked` names the target and `reached_cost(cost)` says what the plan
  reaches, in the plan's shortfall when the target is out of reach."""
  if search == 'greedy':
    plan, reached = _GlobalOrder(graph, scores, constraint).smallest_prefix(
      lambda plan: cost_fn(plan) <= target
    )
    if reached:
      return plan
    shortfall = (
      shortfall_lib.message(graph, _candidates(graph, scores, constraint), constraint, asked, 0, 0)
      if not plan.num_removed
      else f'{asked} is out of reach within the constraints: removing every channel they '
      f'allow ({plan.num_removed}) {reached_cost(cost_fn(plan))}'
    )
    return dataclasses.replace(plan, shortfall=shortfall)
  if search == 'knapsack':
    plan = _knapsack(graph, scores, constraint, cost_fn, target)
    if plan is None:
      return _by_cost(graph, scores, cost_fn, target, constraint, 'greedy', asked, reached_cost)
    return plan
  raise ValueError(f"search={search!r}: use 'greedy' or 'knapsack'.")


def select(
  graph: DependencyGraph,
  variables: PyTree,
  *,
  ratio: float | Mapping[str, float] | None = None,
  flops_target: float | None = None,
  importance: Any = 'l2',
  scope: str = 'uniform',
  n_channels: int | None = None,
  latency_fn: Callable[[Plan], float] | None = None,
  latency_target: float | None = None,
  search: str = 'greedy',
  constraint: Constraint | None = None,
  masks: PyTree | None = None,
  seed: int = 0,
) -> Plan:
  """Chooses the channels to remove.

  Give exactly one target: `ratio` (with `scope='uniform'` or `'global'`),
  `n_channels` (global count), `flops_target` (fraction of the dense model's
  FLOPs to keep, counted on the traced jaxpr), or `latency_fn` with
  `latency_target`.

  Args:
    graph: the DependencyGraph of `jaxprune.structured.trace`.
    variables: the dense variables the graph was traced with.
    ratio: fraction of channels to remove, or `{kind: fraction}` per kind of
      group (`'width'`, `'heads'`, `'head_dim'`, `'channels'`, `'experts'`,
      `'recurrent'`; see
      `ChannelGroup.kind`) with `scope='uniform'`; kinds not named keep all.
    flops_target: in (0, 1]; e.g. 0.25 keeps a quarter of the FLOPs.
    importance: 'l1', 'l2', 'bn_scale', 'density', 'random', or precomputed
      `{group id: scores}` (e.g. `taylor_importance(...)`).
    scope: 'uniform' or 'global' for `ratio`.
    n_channels: number of channels to remove globally.
    latency_fn: `latency_fn(plan) -> float`, e.g. timing `apply_plan`'s result.
    latency_target: target for `latency_fn`.
    search: 'greedy' or 'knapsack' for cost targets.
    constraint: a `Constraint`; default keeps >= 1 channel per group.
    masks: masks for `importance='density'`.
    seed: seed for `importance='random'`.

  Returns:
    A `Plan`.
  """
  check_target(
    ratio=ratio,
    flops_target=flops_target,
    n_channels=n_channels,
    latency_fn=latency_fn,
    latency_target=latency_target,
    scope=scope,
    search=search,
    constraint=constraint,
  )
  if variables is not None:
    check_variables(graph, variables, 'select')
  constraint = constraint or Constraint()
  scores = importance_lib.score_channels(graph, variables, importance, masks=masks, seed=seed)
  if ratio is not None:
    if scope == 'uniform':
      return uniform(graph, scores, ratio, constraint)
    return global_(graph, scores, float(ratio), constraint)
  if n_channels is not None:
    return global_(graph, scores, int(n_channels), constraint)
  if flops_target is not None:
    total = graph.total_flops
    return _by_cost(
      graph,
      scores,
      lambda plan: cost_lib.plan_flops(graph, plan),
      flops_target * total,
      constraint,
      search,
      f'flops_target={flops_target!r}',
      lambda flops: f'keeps {flops / total if total else 1.0:.1%} of the FLOPs',
    )
  return by_cost(graph, scores, latency_fn, latency_target, constraint, search)
