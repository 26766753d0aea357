"""Progress bars for the passes over calibration batches (Taylor and activation
importance, BatchNorm re-calibration)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(iterable: Iterable[Any], desc: str) -> Iterable[Any]:
  """A tqdm progress bar over `iterable`, or `iterable` itself when tqdm is missing."""
  try:
    from tqdm.auto import tqdm
  except ImportError:  # tqdm is an optional dependency (the `examples` extra)
    return iterable
  return tqdm(iterable, desc=desc)
