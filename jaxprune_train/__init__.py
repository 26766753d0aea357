"""The main job: train and prune a Flax model from a config (`jaxprune-train`).

Needs the `examples` extra (scikit-learn, absl-py, tqdm, orbax-checkpoint,
matplotlib; tensorboardX is optional). Each name loads its module on first use,
so a config file's `from jaxprune_train import get_config` and the command's
flag errors and `--help` need none of Flax, orbax or matplotlib. Importing this package
itself needs only the standard library: `python -m jaxprune_train` imports it before
`__main__` puts the job's Ctrl-C answer in place (`_entry`).

The job imports `jaxprune` like any user; `jaxprune` never imports the job.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from jaxprune_train._data import Dataset, get_batch, load_digits, load_npz
  from jaxprune_train._defaults import get_config, pruning_config
  from jaxprune_train._errors import (
    ConfigError,
    DamagedCheckpointError,
    DivergedError,
    IncompatibleWorkdirError,
    RunError,
    StorageError,
    WorkdirBusyError,
  )
  from jaxprune_train._loop import TrainResult, train
  from jaxprune_train._models import CNN, MLP
  from jaxprune_train._report import format_report
  from jaxprune_train._step import TrainState, make_optimizer, make_train_step

# name -> the private module that defines it
_MODULES = {
  'Dataset': '_data',
  'get_batch': '_data',
  'load_digits': '_data',
  'load_npz': '_data',
  'get_config': '_defaults',
  'pruning_config': '_defaults',
  'RunError': '_errors',
  'ConfigError': '_errors',
  'IncompatibleWorkdirError': '_errors',
  'WorkdirBusyError': '_errors',
  'DivergedError': '_errors',
  'StorageError': '_errors',
  'DamagedCheckpointError': '_errors',
  'TrainResult': '_loop',
  'train': '_loop',
  'CNN': '_models',
  'MLP': '_models',
  'format_report': '_report',
  'TrainState': '_step',
  'make_optimizer': '_step',
  'make_train_step': '_step',
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
  """Imports the module that defines `name` on first use (PEP 562)."""
  if name in _MODULES:
    return getattr(importlib.import_module(f'{__name__}.{_MODULES[name]}'), name)
  if name.startswith('_'):
    # `from jaxprune_train import _process` asks here before importing the submodule:
    # the message's suggestions would import JAX before the entry's Ctrl-C handler.
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  from jaxprune._attributes import no_attribute  # only on a miss: it imports JAX

  raise no_attribute(__name__, name, __all__)


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
