"""The job's process plumbing, in one place: Ctrl-C, its last line, and the runtime's noise.

Standard library only: the entry (`_entry`) imports it before JAX, Flax and optax, so
that a Ctrl-C while they load is answered too. Each mechanism below is here because no
standard setting does its work; each names the upstream behaviour it works around and
when it can go.

* **Ctrl-C** has one handler (`_on_ctrl_c`), installed once by the entry and only where
  Ctrl-C has Python's default handler (a program with its own keeps it). What it does is
  set by the phase the job is in: end the job at once with one line and status 130
  (`end_at_once`: starting, joining, setting up, after the last step), or, while the
  job trains, only note it for the loop to honour after the step and its checkpoint
  (`DeferredCtrlC`): Python raises `KeyboardInterrupt` wherever the main thread is,
  often inside orbax's, asyncio's or a finalizer's code during a checkpoint save, where
  it is lost ("Exception ignored in ...") or leaves a save half done. A second Ctrl-C
  while training raises at once. Needed for as long as the job wants one line, not a
  traceback from inside whatever import or library the main thread is in.
* **Ctrl-C or a timeout while joining** (`watchdog`): `jax.distributed.initialize`
  waits inside C++, where no Python signal handler runs until it returns
  (https://docs.python.org/3/library/signal.html#execution-of-python-signal-handlers),
  and JAX's own join timeout aborts the process (SIGABRT). A thread woken through
  `signal.set_wakeup_fd` answers both. Can go when the join can be interrupted and
  raises on its timeout.
* **The runtime's fatal abort** (`guard`, `Relay`, `stop`): once joined, JAX's
  coordination client ends a process itself, from C++, when process 0 (the service) dies
  or another process misses its heartbeats: error log lines, `LOG(FATAL)` "Terminating
  process because the JAX distributed service detected fatal errors", a stack trace,
  then SIGABRT. XLA does this on purpose (https://github.com/openxla/xla/pull/38624,
  documented in https://github.com/jax-ml/jax/pull/39095), and nothing in the process
  runs after it, so a child forked before JAX starts relays stderr and puts the job's
  line in place of the message and what follows it; the runtime's log lines just before
  it (which `TF_CPP_MIN_LOG_LEVEL` hides only when set before JAX is imported,
  https://github.com/AI-Hypercomputer/maxtext/pull/3131, and then with every other
  runtime error) are held for a few seconds and shown only when no fatal message
  follows. Can go when `jax.distributed.initialize` lets Python handle a lost process
  (XLA's client takes a `missed_heartbeat_callback`, which JAX does not pass on;
  `jax_enable_recoverability` keeps the others running, but not past process 0's loss).
* **JAX's abort while joining** (`aborts_as_exit`): the service refuses a process (an
  id given twice, a job of another size) by aborting it, the same `LOG(FATAL)`; the relay
  prints the job's line, and a C-level SIGABRT handler (a Python one would only run after
  the abort) makes the status 1, not -6. Can go with the relay.
* **Abandoned checkpoint I/O** (`quiet_abandoned_io`): when a checkpoint write fails (a
  full disk) or no checkpoint can be read, orbax abandons its other reads and writes
  without cancelling them. Each is then reported as it is garbage-collected: a
  "coroutine ... was never awaited" warning, an unraisable "Exception ignored in:
  <coroutine object _read_array_index_and_device_put>" (hundreds of lines), and from
  tensorstore's threads a "RuntimeError: Event loop is closed" traceback
  (`call_soon_threadsafe` on the loop orbax closed,
  https://github.com/python/cpython/pull/27688; orbax's failure handling,
  https://github.com/google/orbax/issues/605), dozens, around the one line the job
  prints about the failure. Warnings filters and `sys.unraisablehook` drop the first two;
  the tracebacks, written from tensorstore's C++ threads past `sys.excepthook` and
  `threading.excepthook` (hooks there never see them), pass a filter on `sys.stderr`.
  Can go when orbax cancels and awaits what it abandons.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import select
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

# ---------------------------------------------------------------------------------------
# Ctrl-C

_describe: Callable[[], str] | None = None  # the line Ctrl-C ends the job with, now
_deferred: DeferredCtrlC | None = None  # set while the training loop defers Ctrl-C
_CTRL_C_WHILE_TRAINING = (
  b'\nCtrl-C: stopping after this step and its checkpoint; press Ctrl-C again to stop at once.\n'
)


def _on_ctrl_c(signum: int, frame: Any) -> None:
  """The job's one SIGINT handler: what it does is set by `end_at_once` and `DeferredCtrlC`."""
  del signum, frame
  if _deferred is not None:
    _deferred.press()
  elif _describe is not None:
    os.write(2, b'\n')  # off the progress bar's line
    stop(_describe(), 130)
  else:
    raise KeyboardInterrupt


def _ctrl_c_is_ours() -> bool:
  """Makes `_on_ctrl_c` the SIGINT handler where it can; whether it is.

  Only in the main thread, and where Ctrl-C has Python's default handler (or ours): a
  program with its own handler keeps it, and a process that ignores Ctrl-C (started in
  the background) keeps ignoring it.
  """
  if threading.current_thread() is not threading.main_thread():
    return False
  handler = signal.getsignal(signal.SIGINT)
  if handler is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_ctrl_c)
    return True
  return handler is _on_ctrl_c


def end_at_once(describe: Callable[[], str]) -> None:
  """From now on (but while training defers it), Ctrl-C ends the job at once, status 130.

  Args:
    describe: gives the whole line when Ctrl-C comes (so it can say what was saved).
  """
  global _describe
  if _ctrl_c_is_ours():
    _describe = describe


class DeferredCtrlC:
  """Ctrl-C noted for the `check` calls, from `install` until `restore` or `uninstall`."""

  def __init__(self, installed: bool = False, previous: Any = None):
    self.pressed = False
    self._installed = installed
    self._previous = previous

  @classmethod
  def install(cls) -> DeferredCtrlC:
    """Defers Ctrl-C where `end_at_once` could take it (the main thread, no handler of the
    program's own); elsewhere nothing changes and `check` never raises."""
    global _deferred
    previous = signal.getsignal(signal.SIGINT)
    if not _ctrl_c_is_ours():
      return cls()
    _deferred = cls(installed=True, previous=previous)
    return _deferred

  def press(self) -> None:
    """The first Ctrl-C is noted (and said); a second raises at once."""
    if self.pressed:
      raise KeyboardInterrupt
    self.pressed = True
    # os.write, not print: the handler may run in the middle of another write to stderr.
    os.write(2, _CTRL_C_WHILE_TRAINING)

  def check(self) -> None:
    """Raises KeyboardInterrupt if Ctrl-C was pressed."""
    if self.pressed:
      raise KeyboardInterrupt

  def uninstall(self) -> None:
    """Ctrl-C does what it did before `install` again."""
    global _deferred
    if self._installed:
      self._installed = False
      _deferred = None
      signal.signal(signal.SIGINT, self._previous)

  def restore(self) -> None:
    """`uninstall`, then raises if Ctrl-C was pressed."""
    self.uninstall()
    self.check()


@contextlib.contextmanager
def watchdog(seconds: float | None, line: str, interrupted: str) -> Iterator[None]:
  """Ends the process with `line` (status 1) after `seconds` (None: never), or with
  `interrupted` at Ctrl-C (status 130), unless the block is over first.

  A thread: it runs while the main thread waits inside C++, where no Python handler runs.
  Signals reach it through `signal.set_wakeup_fd`.
  """
  wakeup_read, wakeup_write = os.pipe()
  over_read, over_write = os.pipe()
  os.set_blocking(wakeup_write, False)
  in_main = threading.current_thread() is threading.main_thread()
  previous = signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False) if in_main else -1
  deadline = None if seconds is None else time.monotonic() + seconds

  def watch() -> None:
    while True:
      wait = None if deadline is None else max(0.0, deadline - time.monotonic())
      ready = select.select([wakeup_read, over_read], [], [], wait)[0]
      if over_read in ready:
        return
      if not ready:
        stop(line, 1)
      if signal.SIGINT in os.read(wakeup_read, 64):
        stop(interrupted, 130)

  watcher = threading.Thread(target=watch, name='jaxprune-join-watchdog', daemon=True)
  watcher.start()
  try:
    yield
  finally:
    os.write(over_write, b'.')
    watcher.join()
    if in_main:
      signal.set_wakeup_fd(previous)
    for fd in (wakeup_read, wakeup_write, over_read, over_write):
      os.close(fd)


# ---------------------------------------------------------------------------------------
# The last line, and the relay that puts it in place of the runtime's fatal message

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
  """What the relay does with the bytes it reads (a class, so that tests can feed it).

  The process tells it what to do with marker lines, each written in one piece
  (`os.write`, under the pipe's atomic size): `fatal-line` (the line to print if JAX's
  fatal message comes), `joined` (from now on the runtime's log lines are held back for
  `HOLD_SECONDS` only, and printed when no fatal message follows; before, they are about
  a join that failed, and the job's line says it) and `stop-line` (print this line now
  and drop the rest).
  """

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
  """Routes this process's stderr through `Relay` in a forked child (before JAX joins)."""
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

  No shutdown: JAX's would wait for the other processes at its barrier, and one while
  JAX is still starting (its threads compiling, its backends half made) can crash. With
  the relay, what the process writes after the line is dropped, and the process waits
  (briefly) for the relay to have printed it.
  """
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except Exception:  # noqa: BLE001, S110 -- a closed or busy stream must not stop the line
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


@contextlib.contextmanager
def aborts_as_exit(status: int) -> Iterator[None]:
  """Within the block, an abort (SIGABRT) ends the process with `status` instead."""
  import ctypes  # not at the top: the entry imports this module before Ctrl-C is handled

  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
  except (OSError, AttributeError):
    yield  # no C library to ask: JAX's abort stays an abort
    return
  handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda signum: os._exit(status))
  previous = libc.signal(signal.SIGABRT, ctypes.cast(handler, ctypes.c_void_p))
  try:
    yield
  finally:
    libc.signal(signal.SIGABRT, previous)


# ---------------------------------------------------------------------------------------
# Abandoned checkpoint I/O


def quiet_abandoned_io() -> None:
  """Drops the reports of the reads and writes orbax abandons when one of them fails.

  Other warnings, unraisable errors and tracebacks are shown unchanged.
  """
  warnings.filterwarnings(
    'ignore', message="coroutine '.*' was never awaited", category=RuntimeWarning
  )
  sys.unraisablehook = _without_abandoned_coroutines(sys.unraisablehook)
  if not isinstance(sys.stderr, WithoutClosedLoopTracebacks):
    sys.stderr = WithoutClosedLoopTracebacks(sys.stderr)


def _without_abandoned_coroutines(hook: Any) -> Any:
  def unraisable(info: Any) -> None:
    if not isinstance(info.object, types.CoroutineType):
      hook(info)

  return unraisable


class WithoutClosedLoopTracebacks(io.TextIOBase):
  """`sys.stderr` less the 'RuntimeError: Event loop is closed' tracebacks."""

  _NOISE = 'RuntimeError: Event loop is closed'

  def __init__(self, stream: Any):
    super().__init__()
    self._stream = stream
    self._held = threading.local()  # a traceback being written, per thread

  def write(self, text: str) -> int:
    held = getattr(self._held, 'text', None)
    if held is None and not text.startswith('Traceback (most recent call last):'):
      return self._stream.write(text)
    held = (held or '') + text
    last = held.rstrip('\n').rsplit('\n', 1)[-1]
    if held.endswith('\n') and last[:1] not in ('', ' ') and not last.startswith('Traceback'):
      self._held.text = None  # the exception line closes the traceback
      if last != self._NOISE:
        self._stream.write(held)
    else:
      self._held.text = held
    return len(text)

  def flush(self) -> None:
    self._stream.flush()

  def fileno(self) -> int:
    return self._stream.fileno()

  def isatty(self) -> bool:
    return self._stream.isatty()
