"""Orbax checkpoints of the train state, and the config check on resume.

Each checkpoint holds the whole `TrainState` (params, optimizer state with the
pruning state inside it, step) and a JSON item with the run's config and the
scalars the final report needs. Orbax writes a checkpoint into a temporary
directory and renames it once complete, so an interrupted save never replaces
a good checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

CONFIG_FILE = 'config.json'

# Fields that may change between an interrupted run and its resumption: they
# decide how long the run goes on and how often it reports, not the steps it
# takes, so the resumed run still follows the uninterrupted one exactly.
RESUMABLE_FIELDS = frozenset({
    'num_steps', 'log_every', 'eval_every', 'checkpoint_every',
    'max_checkpoints_to_keep', 'progress_bar', 'tensorboard', 'plots',
})


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


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       ignore: Iterable[str] = RESUMABLE_FIELDS
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


class IncompatibleWorkdirError(ValueError):
  """The workdir holds a run whose config differs from the one given."""


def check_compatible(saved: Mapping[str, Any], config: ml_collections.ConfigDict,
                     workdir: str) -> None:
  """Raises unless a run saved with config `saved` may resume under `config`.

  Args:
    saved: the JSON config stored with the earlier run.
    config: the config of the run being started.
    workdir: the run's directory, named in the message.

  Raises:
    IncompatibleWorkdirError: a ValueError naming each differing field and
      both of its values.
  """
  diffs = config_differences(saved, config_to_json(config))
  if diffs:
    lines = '\n'.join(f'  config.{name}: {before!r} in the saved run, {after!r} now'
                      for name, before, after in diffs)
    raise IncompatibleWorkdirError(
        f'--workdir={workdir!r} holds a run with a different config, so it '
        f'cannot be resumed:\n{lines}\nPick a new --workdir (or restore the '
        'old values) instead of overwriting that run.')


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Makes `workdir` belong to `config`: records it, or checks it on resume.

  Args:
    workdir: the run's directory.
    config: the config of the run being started.

  Raises:
    ValueError: if `workdir` holds a run with an incompatible config.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(path):
    with open(path) as f:
      check_compatible(json.load(f), config, workdir)
  os.makedirs(workdir, exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(config_to_json(config), f, indent=2, sort_keys=True)
  os.replace(tmp, path)


class Checkpointer:
  """Saves and restores `(state, meta)` pairs under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, max_to_keep: int = 2):
    """Opens (or creates) the checkpoint directory.

    Args:
      workdir: the run's directory.
      max_to_keep: how many of the newest checkpoints to keep.
    """
    directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_names=('state', 'meta'))

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
    """Writes a checkpoint and waits until it is committed.

    Args:
      step: the training step the state is at.
      state: the train state pytree.
      meta: JSON-able values stored beside the state.
    """
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))))
    self._manager.wait_until_finished()

  def restore_meta(self, step: int) -> dict[str, Any]:
    """Reads only the JSON item of the checkpoint of `step`."""
    restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored.meta)

  def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
    """Reads the checkpoint of `step`.

    Args:
      step: a step with a complete checkpoint.
      like: a train state (or its `jax.eval_shape`) giving structure, dtypes and,
        where its arrays have them, the shardings to restore into (each host
        then reads only its own shards).

    Returns:
      `(state, meta)`.
    """
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None)),
        like)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored.state, dict(restored.meta)

  def close(self) -> None:
    """Waits for pending writes and releases the manager."""
    self._manager.close()
