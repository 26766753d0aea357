"""Ctrl-C during training: honoured at the end of the step, never lost.

Python raises `KeyboardInterrupt` wherever the main thread happens to be when
SIGINT arrives. During a checkpoint save that is often inside orbax's or
asyncio's machinery, and sometimes inside a finalizer (`__del__`, a weakref
callback) that the garbage collector runs: an exception raised there cannot
propagate, Python prints "Exception ignored in ..." and the run goes on as if
Ctrl-C had never been pressed. So while the job trains, the first Ctrl-C only
sets a flag, which the loop checks after each step and its checkpoint; a
second Ctrl-C raises at once, as usual.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


class Interrupts:
  """Ctrl-C deferred to the `check` calls, from `install` until `restore` or `uninstall`."""

  def __init__(self, installed: bool):
    self.pressed = False
    self._installed = installed

  @classmethod
  def install(cls) -> Interrupts:
    """Defers Ctrl-C, where it has Python's default handler and this is the main thread.

    Elsewhere (a worker thread, a program with its own handler) nothing changes
    and `check` never raises.
    """
    if (
      threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
      return cls(installed=False)
    interrupts = cls(installed=True)
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
    """Gives Ctrl-C its default handler back."""
    if self._installed:
      self._installed = False
      signal.signal(signal.SIGINT, signal.default_int_handler)

  def restore(self) -> None:
    """Gives Ctrl-C its default handler back, then raises if it was pressed."""
    self.uninstall()
    self.check()
