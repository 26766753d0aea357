"""The entry of `jaxprune-train`: Ctrl-C answered with the job's line before its imports.

Importing the job takes a second or more (`jaxprune/__init__.py` imports JAX and optax),
and a Ctrl-C then ended it with Python's `KeyboardInterrupt` traceback, or was lost when
a library caught it as an import error. This module is outside the package, so that
importing it runs no `jaxprune/__init__.py`, and needs only the standard library: it puts
the job's start-up answer in place first (one line on stderr, status 130), then imports
the job, which replaces the handler as soon as it runs
(`jaxprune.train._interrupts.end_at_once`).

The console script runs `run`. `python -m jaxprune.train` imports the package before its
`__main__`, so `jaxprune/__init__.py` calls `guard_module_run` as its first statement.
What Python runs before either (its own start-up and site, tens of milliseconds) has
Python's handler.
"""

import os
import signal
import sys

PROGRAM = 'jaxprune-train'
STARTING = 'interrupted while starting; nothing was written.'  # as the job's own line
_MODULES = ('jaxprune.train', 'jaxprune.train.__main__')  # what `python -m` runs as the job


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


def _module_run() -> str | None:
  """The module of `python -m MODULE` in this process's command line, or None."""
  args = getattr(sys, 'orig_argv', [])[1:]
  for at, arg in enumerate(args):
    if arg == '-m':
      return args[at + 1] if at + 1 < len(args) else None
    if arg.startswith('-m'):
      return arg[2:]
  return None


def guard_module_run() -> None:
  """`guard`, where this process is `python -m jaxprune.train` still finding its module.

  Python sets `sys.argv[0]` to '-m' while it imports the packages of the module it runs.
  """
  if sys.argv[:1] == ['-m'] and _module_run() in _MODULES:
    guard()


def run() -> None:
  """Console-script entry point (`jaxprune-train`)."""
  guard()
  from jaxprune.train._main import run as run_job

  run_job()
