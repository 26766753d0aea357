"""Metric writers: a `metrics.jsonl` file and, when tensorboardX is installed,
TensorBoard event files. Both take one flat `{name: number}` dict per step.

`metrics.jsonl` is appended to, one line per record; a record cut short by a
crash or a full disk is dropped with a warning when the file is read back.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxprune_train import _files as files

METRICS_FILE = 'metrics.jsonl'


def _to_python(value: Any) -> Any:
  """Converts a Python, numpy or JAX scalar to a JSON-able int, float or str."""
  if isinstance(value, (str, bool)):
    return value
  dtype = getattr(value, 'dtype', None)
  if isinstance(value, int) or (dtype is not None and np.issubdtype(dtype, np.integer)):
    return int(value)
  # NaN and Inf are written as Python's json writes them (NaN, Infinity).
  return float(value)


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """Reads every record of `<workdir>/metrics.jsonl` (empty if it is absent).

  A line that is not a JSON record with an integer `step` (the last line cut
  short by an interrupted write, or a damaged one), or whose step comes before
  the step of a line above it (the job writes steps in order: such a line was
  added by something else), is dropped with a warning naming the file and the line.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    lines = f.read().split(b'\n')
  records: list[dict[str, Any]] = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict) or type(record.get('step')) is not int:
        raise ValueError('not a record with an integer "step"')
    except ValueError as err:  # json's errors and UnicodeDecodeError are ValueErrors
      # Only the last line can lack its newline: a write cut short.
      what = 'cut short by an interrupted write' if number == len(lines) else f'damaged ({err})'
      warnings.warn(f'{path}: line {number} is {what}; dropped it: {line[:80]!r}', stacklevel=2)
      continue
    if records and record['step'] < records[-1]['step']:
      warnings.warn(
        f'{path}: line {number} has step {record["step"]} after step '
        f'{records[-1]["step"]}: the job writes steps in order, so it did not '
        f'write this line; dropped it: {line[:80]!r}',
        stacklevel=2,
      )
      continue
    records.append(record)
  return records


class MetricsWriter:
  """Appends metric records to `metrics.jsonl` and TensorBoard event files.

  On resume, records after the restored step (written by the interrupted run
  after its last checkpoint) are dropped, so the file holds one history; the
  whole history is also kept in memory as `history`.
  """

  def __init__(self, workdir: str | None, *, resume_step: int = 0, tensorboard: bool = True):
    """Opens the writers.

    Args:
      workdir: directory for `metrics.jsonl` and the event files; None keeps
        the records in memory only.
      resume_step: the step the run restarts from; later records are dropped.
      tensorboard: whether to write TensorBoard events (needs tensorboardX).
    """
    self.history: list[dict[str, Any]] = []
    self._file = None
    self._tb = None
    if workdir is None:
      return
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, METRICS_FILE)
    self.history = [r for r in read_metrics(workdir) if r['step'] <= resume_step]
    files.atomic_write(self.path, ''.join(json.dumps(r) + '\n' for r in self.history))
    self._file = open(self.path, 'a')  # noqa: SIM115 -- closed in close()
    if tensorboard:
      try:
        import tensorboardX  # noqa: F401
      except ImportError:
        warnings.warn(
          f'tensorboardX is not installed; writing only {self.path}. '
          'Install it with `pip install tensorboardX`.',
          stacklevel=2,
        )
      else:
        # The purge step hides events an interrupted run wrote after its checkpoint.
        self._tb = _EventFile(
          os.path.join(workdir, 'tensorboard'), purge_step=resume_step + 1 if resume_step else None
        )

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `{'step': step, **scalars}`."""
    record = {'step': int(step)}
    record.update({k: _to_python(v) for k, v in scalars.items()})
    self.history.append(record)
    if self._file is not None:
      self._file.write(json.dumps(record) + '\n')
      self._file.flush()
    if self._tb is not None:
      self._tb.write(
        step,
        {
          name: value
          for name, value in record.items()
          if name != 'step' and not isinstance(value, str)
        },
      )

  def close(self) -> None:
    """Flushes and closes the writers (both, even if the first one fails)."""
    try:
      if self._file is not None:
        self._file.close()
    finally:
      if self._tb is not None:
        self._tb.close()


class _EventFile:
  """A TensorBoard event file written in the caller's thread, flushed after each record.

  tensorboardX's `SummaryWriter` writes from a thread of its own: on a full
  disk that thread dies with a traceback, and the error surfaces again at
  exit. Here a failed write raises where the job can report it.
  """

  def __init__(self, directory: str, purge_step: int | None):
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    os.makedirs(directory, exist_ok=True)
    self._writer = EventsWriter(os.path.join(directory, 'events'))
    self._event = Event
    if purge_step is not None:
      # TensorBoard drops the events of later steps written before this one.
      self._writer.write_event(
        Event(
          wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)
        )
      )
    self._writer.flush()

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    from tensorboardX.summary import scalar

    for name, value in scalars.items():
      self._writer.write_event(
        self._event(wall_time=time.time(), step=step, summary=scalar(name, value))
      )
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()
