"""Checks of `select`'s targets, run before anything is traced or changed.

Each error names the argument, the value it got and what it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxprune.structured._core.graph import KINDS
from jaxprune.structured._core.plan import Constraint


def _is_number(x: Any) -> bool:
  return not isinstance(x, bool) and isinstance(x, (int, float, np.number))


def check_ratio(ratio: Any) -> None:
  """Checks a ratio: a fraction in [0, 1), or `{kind: fraction}`."""
  if isinstance(ratio, Mapping):
    for kind, value in ratio.items():
      if kind not in KINDS:
        raise ValueError(
          f'ratio[{kind!r}]: unknown kind of group; use {list(KINDS)} (ChannelGroup.kind).'
        )
      if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.number))
        or not (0.0 <= value < 1.0)
      ):
        raise ValueError(
          f'ratio[{kind!r}]={value!r}: the fraction of channels to remove must be in [0, 1).'
        )
    return
  if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.number)):
    raise TypeError(f'ratio={ratio!r}: give a fraction in [0, 1) or {{kind: fraction}}.')
  if not 0.0 <= ratio < 1.0:
    raise ValueError(f'ratio={ratio}: the fraction of channels to remove must be in [0, 1).')


def check_target(
  *,
  ratio: float | None = None,
  flops_target: float | None = None,
  n_channels: int | None = None,
  latency_fn: Callable | None = None,
  latency_target: float | None = None,
  scope: str = 'uniform',
  search: str = 'greedy',
  constraint: Constraint | None = None,
) -> None:
  """Checks `select`'s target arguments (before anything is traced or changed).

  Raises:
    ValueError: naming the argument, its value and what it accepts.
    TypeError: for a constraint that is not a `Constraint`.
  """
  given = [
    name
    for name, v in (
      ('ratio', ratio),
      ('flops_target', flops_target),
      ('n_channels', n_channels),
      ('latency_target', latency_target),
    )
    if v is not None
  ]
  if len(given) != 1:
    raise ValueError(
      f'select: give exactly one of ratio, n_channels, flops_target, '
      f'latency_target; got {given or "none"}.'
    )
  if scope not in ('uniform', 'global'):
    raise ValueError(f"scope={scope!r}: use 'uniform' or 'global'.")
  if search not in ('greedy', 'knapsack'):
    raise ValueError(f"search={search!r}: use 'greedy' or 'knapsack'.")
  if constraint is not None and not isinstance(constraint, Constraint):
    raise TypeError(
      f'constraint: give a jaxprune.structured.Constraint, got {type(constraint).__name__}.'
    )
  if ratio is not None:
    check_ratio(ratio)
    if isinstance(ratio, Mapping) and scope != 'uniform':
      raise ValueError(
        f"ratio={dict(ratio)!r} per kind works with scope='uniform', not "
        f'{scope!r}; for one target across kinds use flops_target.'
      )
  if n_channels is not None and (
    not _is_number(n_channels)
    or not np.isfinite(n_channels)
    or int(n_channels) != n_channels
    or n_channels < 1
  ):
    raise ValueError(
      f'n_channels={n_channels!r}: give the number of channels to remove, an '
      'int >= 1 (or ratio= for a fraction).'
    )
  if flops_target is not None and (not _is_number(flops_target) or not 0.0 < flops_target <= 1.0):
    raise ValueError(
      f'flops_target={flops_target!r}: give the fraction of FLOPs to keep, a '
      'number in (0, 1], e.g. flops_target=0.5.'
    )
  if latency_target is not None and not callable(latency_fn):
    raise ValueError('latency_target needs latency_fn(plan) -> float.')
