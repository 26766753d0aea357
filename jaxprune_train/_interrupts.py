"""Ctrl-C during training: honoured at the end of the step, never lost.

Python raises `KeyboardInterrupt` wherever the main thread happens to be when
SIGINT arrives. During a checkpoint save that is often inside orbax's or
asyncio's machinery, and sometimes inside a finalizer (`__del__`, a weakref
callback) that the garbage collector runs: an exception raised there cannot
propagate, Python prints "Exception ignored in ..." and the run goes on as if
Ctrl-C had never been pressed. So while the job trains, the first Ctrl-C only
sets a flag, which the loop checks after each step and its checkpoint; a
second Ctrl-C raises at once, as usual.

Outside training (starting, joining, restoring, and after the last step), the
command line's Ctrl-C ends the job at once with one line and status 130
(`end_at_once`): nothing is being written then that a rerun would not redo
(every file of the run is replaced atomically), and a handler that never
raises cannot be lost in a finalizer either. Before the job's imports, the
entry (`_entry`, standard library only) answers with the line `STARTING`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from jaxprune_train import _entry
from jaxprune_train import _stderr as stderr
from jaxprune_train._entry import PROGRAM


def stop_now(message: str) -> NoReturn:
  """Ends the job at once: `jaxprune-train: <message>` on stderr, status 130, no shutdown.

  A shutdown while JAX is still starting (its threads compiling, its backends
  half made) can crash the process, and with several processes it would wait
  for the others at JAX's barrier.
  """
  os.write(2, b'\n')  # off the progress bar's line
  stderr.stop(f'{PROGRAM}: {message}', 130)


class _AtOnce:
  """A SIGINT handler that ends the job at once, with the line `describe()` gives then."""

  def __init__(self, describe: Callable[[], str]):
    self.describe = describe

  def __call__(self, signum: int, frame: Any) -> None:
    del signum, frame
    stop_now(self.describe())


def _ours_to_replace(handler: Any) -> bool:
  return (
    handler is signal.default_int_handler
    or isinstance(handler, _AtOnce)
    or handler is _entry._stop  # the start-up line, before the imports
  )


def end_at_once(describe: Callable[[], str]) -> None:
  """From now on (but while training defers it), Ctrl-C ends the job at once with one line.

  Only in the main thread, and where Ctrl-C has Python's default handler, an
  earlier `end_at_once`'s or the entry's: a program with its own handler keeps it.

  Args:
    describe: gives the line's text when Ctrl-C comes (so it can say what was saved).
  """
  if threading.current_thread() is threading.main_thread() and _ours_to_replace(
    signal.getsignal(signal.SIGINT)
  ):
    signal.signal(signal.SIGINT, _AtOnce(describe))


class Interrupts:
  """Ctrl-C deferred to the `check` calls, from `install` until `restore` or `uninstall`."""

  def __init__(self, installed: bool, previous: Any = None):
    self.pressed = False
    self._installed = installed
    self._previous = previous

  @classmethod
  def install(cls) -> Interrupts:
    """Defers Ctrl-C, where this is the main thread and Ctrl-C has Python's default
    handler, `end_at_once`'s or the entry's.

    Elsewhere (a worker thread, a program with its own handler) nothing changes
    and `check` never raises.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not _ours_to_replace(previous):
      return cls(installed=False)
    interrupts = cls(installed=True, previous=previous)
    signal.signal(signal.SIGINT, interrupts._handle)
    return interrupts

  def _handle(self, signum: int, frame: Any) -> None:
    del signum, frame
    if self.pressed:
      raise KeyboardInterrupt
    self.pressed = True
    # os.write, not print: the handler may run in the middle of another write to stderr.
    os.write(
      2,
      b'\nCtrl-C: stopping after this step and its checkpoint; press Ctrl-C '
      b'again to stop at once.\n',
    )

  def check(self) -> None:
    """Raises KeyboardInterrupt if Ctrl-C was pressed."""
    if self.pressed:
      raise KeyboardInterrupt

  def uninstall(self) -> None:
    """Gives Ctrl-C the handler it had before `install` back."""
    if self._installed:
      self._installed = False
      signal.signal(signal.SIGINT, self._previous)

  def restore(self) -> None:
    """Gives Ctrl-C its handler back, then raises if it was pressed."""
    self.uninstall()
    self.check()
