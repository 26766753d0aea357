"""Which run a workdir belongs to: `config.json`, and the config check on resume.

`config.json` records the config of the run that trained the workdir's
checkpoints. A rerun is compared with the config stored in the newest
checkpoint (checksummed, so it decides), or with `config.json` when there is
no checkpoint yet, before anything is written; the file is rewritten only
once the rerun is known to be compatible and is about to train (a refused
run, or a rerun of a finished one, leaves it as it was), or when it
disagrees with the checkpoint (`repair_config`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from jaxprune_train import _defaults as defaults
from jaxprune_train import _files as files
from jaxprune_train._errors import IncompatibleWorkdirError

CONFIG_FILE = 'config.json'

# Fields that may change between an interrupted run and its resumption: they
# decide how long the run goes on and how often it reports, not the steps it
# takes, so the resumed run still follows the uninterrupted one exactly.
RESUMABLE_FIELDS = frozenset(
  {
    'num_steps',
    'log_every',
    'eval_every',
    'checkpoint_every',
    'max_checkpoints_to_keep',
    'progress_bar',
    'tensorboard',
    'plots',
  }
)


def config_to_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as plain JSON values (tuples become lists)."""
  return json.loads(json.dumps(config.to_dict()))


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(_flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def config_differences(
  saved: Mapping[str, Any], current: Mapping[str, Any], ignore: Iterable[str] = RESUMABLE_FIELDS
) -> list[tuple[str, Any, Any]]:
  """Lists `(field, saved value, current value)` for each differing field.

  Args:
    saved: the JSON config stored with a run.
    current: the JSON config of the run being started.
    ignore: top-level fields that may differ.

  Returns:
    The differences, sorted by field name; a field present in only one config
    shows `'<absent>'` for the other.
  """
  ignore = frozenset(ignore)
  old, new = _flatten(saved), _flatten(current)
  diffs = []
  for name in sorted(set(old) | set(new)):
    if name in ignore:
      continue
    before, after = old.get(name, '<absent>'), new.get(name, '<absent>')
    if before != after:
      diffs.append((name, before, after))
  return diffs


def check_compatible(
  saved: Mapping[str, Any], config: ml_collections.ConfigDict, workdir: str
) -> None:
  """Raises unless a run saved with config `saved` may resume under `config`.

  Args:
    saved: the JSON config stored with the earlier run.
    config: the config of the run being started.
    workdir: the run's directory, named in the message.

  Raises:
    IncompatibleWorkdirError: a ValueError naming each differing field and
      both of its values, in one line.
  """
  # A field this version added is absent from runs saved before it: at its
  # default, it changes nothing those runs did.
  added = {
    name: value
    for name, value in _flatten(config_to_json(defaults.get_config())).items()
    if name not in _flatten(saved)
  }
  diffs = [
    (name, before, after)
    for name, before, after in config_differences(saved, config_to_json(config))
    if not (before == '<absent>' and name in added and after == added[name])
  ]
  if diffs:
    fields = '; '.join(
      f'config.{name}: {before!r} in the saved run, {after!r} now' for name, before, after in diffs
    )
    raise IncompatibleWorkdirError(
      f'--workdir={workdir!r} holds a run with a different config, so it cannot be '
      f'resumed ({fields}). Pick a new --workdir (or restore the old values) instead '
      'of overwriting that run.'
    )


def read_config(workdir: str) -> dict[str, Any] | None:
  """The config recorded in `workdir`, or None when there is none or it is unreadable.

  An unreadable `config.json` (cut short or damaged outside the job: the job
  replaces it atomically) is reported with a warning; the run is then checked
  against the config stored in its newest checkpoint only.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
    if not isinstance(saved, dict):
      raise ValueError(f'expected a JSON object, found {type(saved).__name__}')
  except (OSError, ValueError) as err:
    warnings.warn(
      f'{path} is unreadable ({err}); checking the run against the config '
      'stored in its newest checkpoint instead, and rewriting the file.',
      stacklevel=2,
    )
    return None
  return saved


def check_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Raises `IncompatibleWorkdirError` if `workdir` records another run's config."""
  saved = read_config(workdir)
  if saved is not None:
    check_compatible(saved, config, workdir)


def record_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes `config` as the workdir's `config.json`, replacing the old one atomically."""
  _write(workdir, config_to_json(config))


def _write(workdir: str, saved: Mapping[str, Any]) -> None:
  path = os.path.join(workdir, CONFIG_FILE)
  files.atomic_write(path, json.dumps(saved, indent=2, sort_keys=True) + '\n')


def repair_config(
  workdir: str, recorded: Mapping[str, Any] | None, checkpointed: Mapping[str, Any], step: int
) -> None:
  """Rewrites `config.json` from the checkpoint's config where the two disagree.

  The config stored in a checkpoint is covered by its checksum, `config.json`
  is not: when they differ (beyond the fields a resumed run may change), the
  file was edited or damaged outside the job, and the checkpoint's config is
  the run's. Said in a warning.

  Args:
    workdir: the run's directory.
    recorded: the config read from `config.json` (None if absent or unreadable).
    checkpointed: the config stored in the checkpoint of `step`.
    step: the checkpoint's step.
  """
  if recorded is None:
    return
  diffs = config_differences(recorded, checkpointed)
  if not diffs:
    return
  fields = '; '.join(
    f'config.{name}: {before!r} in the file, {after!r} in the checkpoint'
    for name, before, after in diffs
  )
  warnings.warn(
    f'{os.path.join(workdir, CONFIG_FILE)} disagrees with the checksummed config '
    f'of the checkpoint of step {step} ({fields}), so it was changed outside the '
    "job; rewrote it with the checkpoint's config.",
    stacklevel=2,
  )
  _write(workdir, checkpointed)
