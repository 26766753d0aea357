"""A multi-process job's stderr, relayed by a child process: the job's line in place of JAX's.

JAX's coordination client ends a process itself, from C++, when process 0
(which runs the coordination service) dies or another process misses its
heartbeats: a log message, a stack trace, then SIGABRT. Nothing in the
process runs after it, so a child forked before JAX starts relays stderr and
puts the job's line in place of the message and everything after it.

The process tells the child what to do with marker lines, each written in one
piece (`os.write`, under the pipe's atomic size):

* `fatal-line`: the line to print if JAX's fatal message comes;
* `joined`: the job has joined; from now on the runtime's own log lines are
  held back for a few seconds only, and printed when no fatal message follows
  (before, they are about a join that failed, and the job's line says it);
* `stop-line`: print this line now and drop the rest (`stop`).
"""

from __future__ import annotations

import math
import os
import re
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

_MARKER = b'\0jaxprune-'
_JAX_FATAL = b'Terminating process because the JAX distributed service detected fatal errors'
# The distributed runtime's own log lines (glog's `E1128 03:03:31.55 5169
# coordination_service.cc:1549] ...`, several lines each, from the coordination
# service, its agent and the preemption manager) come just before its fatal message.
_RUNTIME_LOG = re.compile(
  rb'^[EWF]\d{4} [\d:.]+ +\d+ (?:coordination_service|'
  rb'coordination_service_agent|preemption_sync_manager|client)'
  rb'\.(?:cc|h):',
  re.M,
)
HOLD_SECONDS = 5.0
_STOP_WAIT_SECONDS = 2.0  # for the child to write the last line before the process ends

_child: int | None = None  # the relay's pid, once `guard` forked it


class Relay:
  """What the child does with the bytes it reads (a class, so that tests can feed it)."""

  def __init__(self, write: Callable[[bytes], None]):
    self._write = write
    self.fatal_line = b''
    self.done = False  # a line ended the output: the rest is dropped
    self.held = b''  # runtime log lines, and what followed them
    self.held_until = math.inf
    self._hold_seconds = math.inf  # until the job has joined
    self._partial = b''  # a marker line not read whole yet

  def feed(self, chunk: bytes, now: float) -> None:
    """Relays `chunk`, read at time `now` (seconds, monotonic)."""
    data, self._partial = self._partial + chunk, b''
    while not self.done:
      at = data.find(_MARKER)
      end = data.find(b'\n', at) if at >= 0 else -1
      if end < 0:
        cut = data.rfind(b'\0')  # a marker read in part: kept for the next read
        if at >= 0 or (cut >= 0 and _MARKER.startswith(data[cut:])):
          at = at if at >= 0 else cut
          data, self._partial = data[:at], data[at:]
        self._text(data, now)
        return
      self._text(data[:at], now)
      kind, _, text = data[at + len(_MARKER) : end].partition(b':')
      data = data[end + 1 :]
      if kind == b'fatal-line':
        self.fatal_line = text
      elif kind == b'joined':
        self._hold_seconds = HOLD_SECONDS
        if self.held:
          self.held_until = now + HOLD_SECONDS
      elif kind == b'stop-line' and not self.done:
        self.held, self.done = b'', True
        self._write(text + b'\n')

  def _text(self, data: bytes, now: float) -> None:
    if self.done or not data:
      return
    data, was_held, self.held = self.held + data, bool(self.held), b''
    at = data.find(_JAX_FATAL)
    if at >= 0:
      before = data[: data.rfind(b'\n', 0, at) + 1]
      log = _RUNTIME_LOG.search(before)
      self._write(before[: log.start() if log else len(before)] + self.fatal_line + b'\n')
      self.done = True
      return
    log = None if was_held else _RUNTIME_LOG.search(data)
    if was_held:
      self.held = data  # still within the moment the first held line started
    elif log:
      self._write(data[: log.start()])
      self.held, self.held_until = data[log.start() :], now + self._hold_seconds
    else:
      self._write(data)

  def tick(self, now: float) -> None:
    """Prints the held lines once their time is up: no fatal message followed."""
    if self.held and now >= self.held_until:
      self._write(self.held)
      self.held = b''

  def end(self) -> None:
    """The process closed stderr. Lines held while joining are dropped: the job's own
    line said why it could not join."""
    if not self.done and self._hold_seconds != math.inf:
      self._write(self.held)
    if not self.done:
      self._write(self._partial)


def _write_all(fd: int, data: bytes) -> None:
  while data:
    data = data[os.write(fd, data) :]


def _relay(source: int, target: int) -> NoReturn:
  """The child: relays `source` to `target` until every writer is gone, then exits."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the job, not for this copy
  relay = Relay(lambda data: _write_all(target, data))
  while True:
    wait = None
    if relay.held and relay.held_until != math.inf:
      wait = max(0.0, relay.held_until - time.monotonic())
    if select.select([source], [], [], wait)[0]:
      chunk = os.read(source, 65536)
      if not chunk:
        break
      relay.feed(chunk, time.monotonic())
    relay.tick(time.monotonic())
  relay.end()
  os._exit(0)


def guard() -> None:
  """Routes this process's stderr through `Relay` in a forked child (before JAX starts)."""
  global _child
  sys.stderr.flush()
  source, sink = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(sink)
    _relay(source, os.dup(2))
  os.close(source)
  os.dup2(sink, 2)
  os.close(sink)
  _child = pid


def _mark(kind: str, text: str = '') -> None:
  sys.stderr.flush()
  os.write(2, _MARKER + kind.encode() + b':' + text.encode()[:3000] + b'\n')


def set_fatal_line(line: str) -> None:
  """The line printed in place of JAX's fatal message, should it come."""
  if _child is not None:
    _mark('fatal-line', line)


def joined() -> None:
  """Tells the relay the job has joined (its runtime logs are news from now on)."""
  if _child is not None:
    _mark('joined')


def stop(line: str, status: int) -> NoReturn:
  """Prints `line` as the process's last, and ends it at once with `status`.

  No shutdown: JAX's would wait for the other processes at its barrier. With
  the relay, what the process writes after the line is dropped, and the
  process waits (briefly) for the relay to have printed it.
  """
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except Exception:  # noqa: BLE001, S110 -- a closed stream must not stop the line
    pass
  if _child is None:
    os.write(2, line.encode() + b'\n')
    os._exit(status)
  _mark('stop-line', line)
  os.close(2)  # the relay's last writer: it prints the line, then ends
  deadline = time.monotonic() + _STOP_WAIT_SECONDS
  while time.monotonic() < deadline:
    try:
      if os.waitpid(_child, os.WNOHANG)[0]:
        break
    except ChildProcessError:
      break
    time.sleep(0.01)
  os._exit(status)
