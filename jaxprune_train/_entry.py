"""The entry of `jaxprune-train` and `python -m jaxprune_train`: Ctrl-C at start-up.

Importing the job takes a second or more (JAX, optax, Flax), and a Ctrl-C then would end
it with Python's `KeyboardInterrupt` traceback from inside an import, or be lost where a
library catches it as an import error. This module and `_process` need only the standard
library (as does the package's `__init__`), so the job's Ctrl-C handler is in place
before the imports: one line on stderr, status 130.
"""

from jaxprune_train import _process as process

PROGRAM = 'jaxprune-train'
STARTING = 'interrupted while starting; nothing was written.'


def run() -> None:
  """Console-script entry point (`jaxprune-train`)."""
  process.end_at_once(lambda: f'{PROGRAM}: {STARTING}')
  from jaxprune_train._main import run as run_job

  run_job()
