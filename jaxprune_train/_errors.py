"""The errors that stop `jaxprune-train` for a reason the user can act on.

Each message is one line that names the field (or file), the value and the
fix; the command line prints it as it is and exits non-zero, without a
traceback. Anything else that escapes the job is a bug and keeps its
traceback.
"""

from __future__ import annotations


class RunError(Exception):
  """The run stopped for a reason the user can fix; the message says how."""


class ConfigError(RunError, ValueError):
  """A config field, the data file, the mesh or the workdir does not fit."""


class IncompatibleWorkdirError(ConfigError):
  """The workdir holds a run whose config differs from the one given."""


class WorkdirBusyError(RunError):
  """Another run holds the workdir's lock."""


class DivergedError(RunError):
  """The loss or the train state stopped being finite."""


class StorageError(RunError):
  """A file of the run could not be written (disk full, quota, permissions)."""


class DamagedCheckpointError(RunError):
  """No checkpoint of the workdir can be read back intact."""


def one_line(text: str) -> str:
  """`text` with its lines joined by '; ', for messages printed as one line."""
  return '; '.join(line.strip() for line in str(text).splitlines() if line.strip())
