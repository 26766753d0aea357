"""What a plan that falls short of its target says (`Plan.shortfall`): what was asked,
what the plan removes and why, so that `prune`'s result and `verify` can say it too."""

from __future__ import annotations

from collections.abc import Sequence

from jaxprune.structured._core.graph import ChannelGroup, DependencyGraph
from jaxprune.structured._core.plan import Constraint
from jaxprune.structured._primitives import table


def why_nothing(graph: DependencyGraph, candidates: Sequence[ChannelGroup]) -> str:
  """Why a selector found no channel to remove, given the groups it may prune."""
  prunable = [g for g in graph.groups if g.prunable]
  if not prunable:
    unknown = sorted(name for name in graph.blocked_primitives if table.lookup(name) is None)
    if unknown:
      return (
        f'no channel group is prunable; primitives with no channel rule block them '
        f'({", ".join(unknown)}): register a rule (jaxprune.structured.register_rule) for '
        'any that passes channels through'
      )
    return 'no channel group is prunable (graph.unprunable_table() says why)'
  if not candidates:
    return (
      f'each of the {len(prunable)} prunable groups is locked, approximate '
      '(Constraint(allow_approximate=True) selects those) or at its minimum size'
    )
  largest = max(g.size for g in candidates)
  return (
    f'the target rounds down to no channel in any of the {len(candidates)} groups it may '
    f'prune (the largest has {largest} channels)'
  )


def message(
  graph: DependencyGraph,
  candidates: Sequence[ChannelGroup],
  constraint: Constraint,
  asked: str,
  removed: int,
  wanted: int,
) -> str | None:
  """The plan's `shortfall`: None when it removes the `wanted` channels `asked` means.

  Args:
    graph: the graph the plan is for.
    candidates: the groups the selector may prune (prunable, unlocked, above their
      minimum).
    constraint: the selector's constraint.
    asked: the target as the user gave it, e.g. "ratio=0.25".
    removed: channels the plan removes.
    wanted: channels the target asks for; 0 when it names none (a cost target).

  Returns:
    One line, or None.
  """
  if removed >= wanted > 0:
    return None
  why = (
    f'kept counts rounded up to a multiple of round_to={constraint.round_to}'
    if constraint.round_to > 1
    else 'the constraint (min_channels, min_ratio) keeps more'
  )
  if removed == 0:
    return f'{asked} removes nothing: {why if wanted else why_nothing(graph, candidates)}'
  return f'{asked} asks for {wanted} channels, the plan removes {removed}: {why}'
