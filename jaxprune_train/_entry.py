"""The entry of `jaxprune-train` and `python -m jaxprune_train`: Ctrl-C at start-up.

Importing the job takes a second or more (JAX, optax, Flax), and a Ctrl-C then would end
it with Python's `KeyboardInterrupt` traceback from inside an import, or be lost where a
library catches it as an import error. This module needs only the standard library (as
does the package's `__init__`), so it runs first and puts the job's start-up answer in
place: one line on stderr, status 130. The job replaces the handler as soon as it runs
(`_interrupts.end_at_once`), recognising this module's handler by `_stop`.
"""

import os
import signal

PROGRAM = 'jaxprune-train'
STARTING = 'interrupted while starting; nothing was written.'


def _stop(signum, frame):
  """Ends the process at once with the start-up line (no shutdown: an import is under way)."""
  del signum, frame
  os.write(2, f'\n{PROGRAM}: {STARTING}\n'.encode())
  os._exit(130)


def guard() -> None:
  """From now on until the job replaces it, Ctrl-C ends the process with the start-up line.

  Only in the main thread, and where Ctrl-C has Python's default handler: a process that
  ignores Ctrl-C (started in the background) keeps ignoring it, as the job does.
  """
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    try:
      signal.signal(signal.SIGINT, _stop)
    except ValueError:  # not the main thread
      pass


def run() -> None:
  """Console-script entry point (`jaxprune-train`)."""
  guard()
  from jaxprune_train._main import run as run_job

  run_job()
