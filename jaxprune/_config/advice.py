"""Warnings about hyperparameters that are valid but cannot do what they seem to ask.

`HParams` calls `warn_about` once, when a config is frozen (`jaxprune._config.hparams`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jaxprune import _warnings as warnings_lib
from jaxprune._config import schedule as schedule
from jaxprune._config.fields import Fields
from jaxprune._numerics import MAX_NBINS


def _warn(message: str) -> None:
  warnings_lib.warn(f'jaxprune: {message}')


def warn_about(h: Fields, map_targets: Sequence[float]) -> None:
  """Warns about settings that are valid but cannot do what they seem to ask.

  Args:
    h: the settings.
    map_targets: the sparsities of weight_sparsity_map's entries, parsed.
  """
  for message in schedule.window_problems(h):
    _warn(message)
  _warn_about_bins(h, map_targets)


def lowest_bin_share(nbins: int, max_in_stds: float) -> float:
  """P(|z| < max_in_stds / nbins): the share of normal weights in the lowest bin [0, max/nbins)."""
  return math.erf(max_in_stds / (nbins * math.sqrt(2.0)))


def _warn_about_bins(h: Fields, map_targets: Sequence[float]) -> None:
  """Warns when the histogram rule prunes nothing at a target, for normal weights.

  A histogram threshold is a multiple of max|w| / nbins
  (docs/explanation/semantics.md#histogram-thresholds): 0, so nothing pruned, while the
  lowest bin holds the target share of the weights.
  The largest of 10**4 normal weights is about 4 standard deviations, of 10**6
  about 5; with 5, nbins <= 7 prune nothing at 50%, nbins <= 3 nothing at 90%.
  """
  targets = sorted({s for s in (h.target_sparsity, *map_targets) if s > 0})
  if h.threshold_method != 'histogram' or not targets:
    return
  low, high = lowest_bin_share(h.nbins, 4.0), lowest_bin_share(h.nbins, 5.0)
  unreached = [s for s in targets if s <= high]
  if not unreached:
    return
  needed = bins_needed(unreached[0], h.nbins)
  fix = (
    f"Use nbins >= {needed} (TF's default is 256) or threshold_method='exact'."
    if needed is not None
    else f"No nbins up to {MAX_NBINS} (2**24) reaches it: use threshold_method='exact'."
  )
  _warn(
    f'nbins={h.nbins}: a histogram threshold is a multiple of max|w|/{h.nbins}, and it '
    f'prunes nothing while the lowest bin [0, max|w|/{h.nbins}) holds the target share of '
    f"a layer's weights. For normally distributed weights (10**4 to 10**6 of them, max 4 "
    f'to 5 standard deviations) that bin holds {low:.1%} to {high:.1%}, so target '
    f'sparsity {", ".join(f"{s:g}" for s in unreached)} can prune nothing, and larger '
    f"ones fall short by up to a bin's share. {fix}"
  )


def bins_needed(target: float, nbins: int) -> int | None:
  """The fewest bins, at least `nbins`, whose lowest bin holds less than `target` at 5 stds.

  The share falls as the bins grow, so a bisection over [nbins, MAX_NBINS] finds it in at
  most 24 steps, whatever the target (a tiny one needs more bins than any valid nbins:
  None).
  """
  if lowest_bin_share(MAX_NBINS, 5.0) >= target:
    return None
  low, high = nbins, MAX_NBINS  # share(high) < target; the answer lies in [low, high]
  while low < high:
    middle = (low + high) // 2
    if lowest_bin_share(middle, 5.0) < target:
      high = middle
    else:
      low = middle + 1
  return low
