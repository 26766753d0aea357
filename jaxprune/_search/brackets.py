"""Searches of a bracket for the first integer whose count reaches a goal, adaptive or fixed.

The threshold rules (`_thresholds`) reduce their searches to this one: per unit, the
first k in (lo, hi] with `reaches(k)`, monotone in k, where one call counts every unit's
candidates in one pass over the weights. The adaptive search (`first_reaching`) gallops
from a guess in a loop that runs until every bracket is closed; the fixed search
(`fixed_first_reaching`) writes out a static number of wider passes.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import Array, lax

# Candidate thresholds per unit and pass. A pass costs about (1 + 0.4 * PROBES)
# max passes on CPU; with the sampled estimate two settle most searches in one.
PROBES = 2
# The fixed search's candidates per pass: 15 compares per weight keep a GPU's pass
# bound by memory, and split a bracket 16 ways (two passes for 256 bins).
FIXED_PROBES = 15


def _evenly_spaced(lo: Array, hi: Array, offsets: Array) -> Array:
  """(units, J) candidates lo + ceil((hi - lo) * j / (J + 1)) for j in offsets = 1..J,
  without int32 overflow: each part of the split bracket holds at most
  ceil((hi - lo) / (J + 1)) candidates."""
  parts = offsets.shape[0] + 1
  quotient, remainder = jnp.divmod((hi - lo)[:, None], parts)
  return lo[:, None] + quotient * offsets + (remainder * offsets + (parts - 1)) // parts


def _inside(candidates: Array, lo: Array, hi: Array) -> Array:
  """Candidates moved into (lo, hi) (onto hi when the bracket is closed)."""
  return jnp.clip(candidates, lo[:, None] + 1, jnp.maximum(hi[:, None] - 1, lo[:, None] + 1))


def _narrowed(lo: Array, hi: Array, candidates: Array, ok: Array) -> tuple[Array, Array]:
  """The bracket (lo, hi] after a pass: the last candidate short of the goal, the first
  one reaching it."""
  return (
    jnp.maximum(lo, jnp.max(jnp.where(ok, lo[:, None], candidates), axis=1)),
    jnp.minimum(hi, jnp.min(jnp.where(ok, candidates, hi[:, None]), axis=1)),
  )


def first_reaching(
  thresholds_of: Callable[[Array], Array],
  reaches: Callable[[Array, Array, Array], Array],
  lo: Array,
  hi: Array,
  guess: Array | None = None,
) -> Array:
  """Per unit, the first k in (lo, hi] with reaches(k), given not reaches(lo), reaches(hi).

  Candidates k are (units, J) int32; `thresholds_of(k)` maps them to the
  float32 values to count at, and `reaches(thresholds, k, active)` to (units, J)
  bools with one counting pass over the parts that hold an `active` unit (one
  still searching; the others' answers are ignored, as their bracket is closed).
  With a guess, the first pass probes the J candidates ending at the guess (a
  right guess finishes there), and the next ones gallop away from it by 1, 2,
  3 ... then 3, 6, 9 ... candidates; otherwise (and once the gallop spans the
  bracket) each pass splits (lo, hi) into J + 1 parts.

  The next pass's thresholds are computed at the end of a pass and carried by
  the loop, so every part reads one stored array (XLA would otherwise copy
  their arithmetic into each part's pass).
  """
  offsets = jnp.arange(1, PROBES + 1, dtype=jnp.int32)

  def candidates_of(lo, hi, reach, first):
    candidates = _evenly_spaced(lo, hi, offsets)
    if guess is not None:
      ahead = reach[:, None] * offsets
      up = (lo >= guess) & (lo + reach * PROBES < hi)
      down = (hi < guess) & (hi - reach * PROBES > lo)
      candidates = jnp.where(up[:, None], lo[:, None] + ahead, candidates)
      candidates = jnp.where(down[:, None], hi[:, None] - ahead, candidates)
      candidates = jnp.where(first, guess[:, None] - PROBES + offsets, candidates)
    return _inside(candidates, lo, hi)

  def step(state):
    lo, hi, reach, candidates, thresholds = state
    lo, hi = _narrowed(lo, hi, candidates, reaches(thresholds, candidates, hi - lo > 1))
    candidates = candidates_of(lo, hi, reach, False)
    reach = jnp.minimum(reach * (PROBES + 1), 2**20)
    return lo, hi, reach, candidates, thresholds_of(candidates)

  candidates = candidates_of(lo, hi, jnp.ones_like(lo), True)
  state = (lo, hi, jnp.ones_like(lo), candidates, thresholds_of(candidates))
  state = lax.while_loop(lambda s: jnp.any(s[1] - s[0] > 1) | (s[2][0] == 1), step, state)
  return state[1]


def passes_for(size: int) -> int:
  """How many fixed-search passes close a bracket of `size` candidates (static)."""
  passes = 0
  while size > 1:
    size = -(-size // (FIXED_PROBES + 1))
    passes += 1
  return passes


def fixed_first_reaching(
  thresholds_of: Callable[[Array], Array],
  reaches: Callable[[Array, Array, Array | None], Array],
  lo: Array,
  hi: Array,
  passes: int,
  loop: bool = True,
) -> Array:
  """`first_reaching` as a fixed search: per unit, the first k in (lo, hi] with reaches(k).

  `passes` passes, written out one after the other, each split every unit's
  bracket into FIXED_PROBES + 1 parts and count all parts (no conditional skips
  a settled one: on an accelerator that would cost more than the count). A
  bracket of n candidates closes in `passes_for(n)` passes; with `loop`, a
  loop of the same passes closes whatever is still open (with a static bound
  that suffices, pass `loop=False`: then the step holds no loop at all).
  """
  offsets = jnp.arange(1, FIXED_PROBES + 1, dtype=jnp.int32)

  def narrow(bounds):
    lo, hi = bounds
    candidates = _inside(_evenly_spaced(lo, hi, offsets), lo, hi)
    return _narrowed(lo, hi, candidates, reaches(thresholds_of(candidates), candidates, None))

  bounds = (lo, hi)
  for _ in range(passes):
    bounds = narrow(bounds)
  if loop:
    bounds = lax.while_loop(lambda b: jnp.any(b[1] - b[0] > 1), narrow, bounds)
  return bounds[1]
