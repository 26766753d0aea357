"""The training loop's progress: tqdm's bar on a terminal, a plain line now and then elsewhere.

tqdm redraws its bar with carriage returns: in a file (a job scheduler's log, `2> log`)
that is one line growing by a bar each redraw. Where stderr is not a terminal the job
prints a whole line instead at every tenth of the run and at least every
`EVERY_SECONDS`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import tqdm

EVERY_SECONDS = 60.0


class PlainProgress:
  """tqdm's calls the loop makes (`update`, `set_postfix`, `write`, `close`), as plain lines
  on `stream`:

      step 1200/3000 (40%), 780.7 steps/s: loss=0.016, acc=1.000, sparsity=0.736
  """

  def __init__(
    self,
    total: int,
    initial: int,
    stream: TextIO,
    clock: Callable[[], float] = time.monotonic,
    every_seconds: float = EVERY_SECONDS,
  ):
    self._total = total
    self._step = initial
    self._stream = stream
    self._clock = clock
    self._every_seconds = every_seconds
    self._postfix: dict[str, Any] = {}
    self._last_step = initial
    self._last_time = clock()

  def set_postfix(self, **values: Any) -> None:
    """The values the next line ends with."""
    self._postfix = values

  def write(self, text: str) -> None:
    """Prints `text` on stdout, as tqdm's `write` does (the evaluations' lines)."""
    print(text, file=sys.stdout, flush=True)

  def update(self, n: int = 1) -> None:
    """`n` more steps are done; prints a line at each tenth of the run, and once
    `every_seconds` have passed since the last one."""
    before, self._step = self._step, self._step + n
    now = self._clock()
    tenth = self._step * 10 // self._total > before * 10 // self._total
    if tenth or now - self._last_time >= self._every_seconds:
      self._line(now)

  def _line(self, now: float) -> None:
    seconds = now - self._last_time
    rate = f', {(self._step - self._last_step) / seconds:.1f} steps/s' if seconds > 0 else ''
    values = ', '.join(f'{name}={value}' for name, value in self._postfix.items())
    percent = 100 * self._step // self._total
    line = f'step {self._step}/{self._total} ({percent}%){rate}'
    print(line + (f': {values}' if values else ''), file=self._stream, flush=True)
    self._last_step, self._last_time = self._step, now

  def close(self) -> None:
    """Nothing to close: each line was whole."""


def progress(total: int, initial: int, enabled: bool, stream: TextIO | None = None) -> Any:
  """tqdm's bar on a terminal, `PlainProgress` elsewhere, or a bar that shows nothing.

  Args:
    total: the run's last step.
    initial: the step it starts from (a resumed run's checkpoint).
    enabled: whether to show progress at all.
    stream: where it goes (default: `sys.stderr`, as tqdm's bar).

  Returns:
    An object with tqdm's `update`, `set_postfix`, `write` and `close`.
  """
  stream = sys.stderr if stream is None else stream
  if enabled and initial < total and not _is_terminal(stream):
    return PlainProgress(total, initial, stream)
  return tqdm.tqdm(
    total=total,
    initial=initial,
    unit='step',
    disable=not enabled or initial >= total,
    dynamic_ncols=True,
    file=stream,
  )


def _is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # no such method, or a closed stream
    return False
