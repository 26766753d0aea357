"""Side-by-side timing: candidates run interleaved, so load drift hits them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax


def interleaved(
  candidates: dict[str, Callable[[], object]], rounds: int, rounds_for: dict[str, int] | None = None
) -> dict[str, float]:
  """Median seconds per call of each candidate, timed in turns after a warm-up call.

  Each round starts one candidate further on, so that every candidate is timed after
  each of the others (a call runs slower after some neighbours: two identical compiled
  steps differed by 25% in a fixed order).
  """
  rounds_for = rounds_for or {}
  for fn in candidates.values():
    jax.block_until_ready(fn())
  times: dict[str, list[float]] = {name: [] for name in candidates}
  names = list(candidates)
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      fn = candidates[name]
      if r >= rounds_for.get(name, rounds):
        continue
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(ts) for name, ts in times.items()}


def table(header: list[str], rows: list[list[str]]) -> str:
  """A Markdown table."""
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join('---' for _ in header) + '|']
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
  return '\n'.join(lines)
