"""Orbax checkpoints of the train state, verified by checksums when read back.

Each checkpoint holds the whole `TrainState` (params, optimizer state with the
pruning state inside it, step) and a JSON item, `meta`, with the run's config,
the scalars the final report needs, a CRC-32 of every array of the state and
one of `meta` itself. Orbax writes a checkpoint into a temporary directory and
renames it once complete, and `save` returns only after that rename, so a save
cut short never replaces a good checkpoint.

Reading back, a checkpoint that cannot be restored or whose arrays differ
from their checksums (a truncated file, a flipped bit) is set aside in
`damaged_checkpoints/` and the next older one is used, with a warning that
names the bad one; when none can be read, the run stops and says so, leaving
every checkpoint where it is.
"""

from __future__ import annotations

import collections
import json
import os
import re
import warnings
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxprune import PruningState
from jaxprune_train import _distributed as distributed
from jaxprune_train import _files as files
from jaxprune_train._errors import DamagedCheckpointError, IncompatibleWorkdirError, one_line

CHECKPOINTS_DIR = 'checkpoints'
DAMAGED_DIR = 'damaged_checkpoints'
_CHECKSUMS = 'checksums'
_META_CHECKSUM = 'meta_checksum'


class _Damaged(Exception):
  """A checkpoint that cannot be read back as it was written."""


def state_checksums(state: Any) -> dict[str, int]:
  """The CRC-32 of each array of `state` (with its dtype and shape), by key path.

  With several processes the arrays are gathered whole first (a collective:
  every process calls it), so a checksum does not depend on the mesh or on
  how many processes wrote the checkpoint.

  Args:
    state: a pytree of arrays.

  Returns:
    `{jax.tree_util.keystr(path): crc}`, e.g. `{".params['Dense_0']['kernel']": ...}`.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(distributed.host_copy(state)))
  sums = {}
  for path, leaf in flat:
    array = np.asarray(leaf)
    header = zlib.crc32(f'{array.dtype.str}{array.shape}'.encode())
    sums[jax.tree_util.keystr(path)] = zlib.crc32(array.tobytes(), header)
  return sums


def _meta_checksum(meta: Mapping[str, Any]) -> int:
  rest = {k: v for k, v in meta.items() if k != _META_CHECKSUM}
  return zlib.crc32(json.dumps(rest, sort_keys=True).encode())


def _verify(state: Any, meta: Mapping[str, Any]) -> None:
  expected = meta[_CHECKSUMS]
  actual = state_checksums(state)
  if set(actual) != set(expected):
    raise _Damaged(
      f'its arrays {sorted(set(actual) ^ set(expected))} do not match the '
      'checksum list written with it'
    )
  bad = [name for name in actual if actual[name] != expected[name]]
  if bad:
    raise _Damaged(
      f'array {bad[0]} does not match the checksum written with it'
      + (f' ({len(bad) - 1} more)' if len(bad) > 1 else '')
    )


class Checkpointer:
  """Saves and restores `(state, meta)` pairs under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, max_to_keep: int = 2):
    """Opens (or creates) the checkpoint directory.

    Args:
      workdir: the run's directory.
      max_to_keep: how many of the newest checkpoints to keep (at least 1).
    """
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(
        f'max_checkpoints_to_keep={max_to_keep!r}: must be an integer >= 1, '
        'or no checkpoint would be left to resume from.'
      )
    self.workdir = os.path.abspath(workdir)
    self.directory = os.path.join(self.workdir, CHECKPOINTS_DIR)
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
      item_names=('state', 'meta'),
    )

  def steps(self) -> list[int]:
    """The steps of the complete checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
    """Writes a checkpoint with checksums; returns once it is committed.

    A step that already has a checkpoint is left as it is.

    Args:
      step: the training step the state is at.
      state: the train state pytree.
      meta: JSON-able values stored beside the state.

    Raises:
      StorageError: the disk is full or not writable; older checkpoints are intact.
    """
    if step in self._manager.all_steps():
      return
    meta = dict(meta)
    meta[_CHECKSUMS] = state_checksums(state)
    meta[_META_CHECKSUM] = _meta_checksum(meta)
    newest = self.latest_step()
    then = (
      'older checkpoints are intact (the newest is step '
      f'{newest}); free some space, then run the same command to resume'
      if newest is not None
      else 'free some space, then run the same command'
    )
    with files.writing(f'the checkpoint of step {step}', self.directory, then):
      self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
      )
      # Saves are asynchronous: the checkpoint is only safe (and `step` only
      # reported as saved) once the background commit has renamed it.
      self._manager.wait_until_finished()

  def _read_meta(self, step: int) -> dict[str, Any]:
    error = None
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      meta = dict(restored.meta)
    except Exception as err:  # noqa: BLE001 -- any failure to read means a damaged file
      error = err
    _agree(error, 'meta item')
    if _META_CHECKSUM not in meta or _CHECKSUMS not in meta:
      raise _Damaged('its meta item has no checksums')
    if meta[_META_CHECKSUM] != _meta_checksum(meta):
      raise _Damaged('its meta item does not match the checksum written with it')
    return meta

  def _read_state(self, step: int, like: Any, meta: Mapping[str, Any]) -> Any:
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None)), like
    )
    older = _as_written_before(abstract, set(meta[_CHECKSUMS]))
    error = None
    try:
      restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract if older is None else older)
        ),
      )
    except Exception as err:  # noqa: BLE001 -- any failure to read means a damaged file
      error = err
    _agree(error, 'state')
    _verify(restored.state, meta)
    return restored.state if older is None else _with_added_fields(restored.state, abstract)

  def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
    """Reads and verifies the checkpoint of `step`.

    Args:
      step: a step with a complete checkpoint.
      like: a train state (or its `jax.eval_shape`) giving structure, dtypes and,
        where its arrays have them, the shardings to restore into.

    Returns:
      `(state, meta)`; `meta` without the checksums.

    Raises:
      DamagedCheckpointError: it cannot be read back as it was written.
    """
    try:
      meta = self._read_meta(step)
      state = self._read_state(step, like, meta)
    except _Damaged as err:
      raise DamagedCheckpointError(self._describe(step, err)) from err
    return state, _public(meta)

  def restore_newest(
    self, like: Any, check_meta: Callable[[dict[str, Any]], None]
  ) -> tuple[int, Any, dict[str, Any]] | None:
    """Restores the newest checkpoint that reads back intact.

    Newer damaged checkpoints are moved to `<workdir>/damaged_checkpoints/`
    with a warning naming each and why, so that the run saves its new
    checkpoints of those steps in their place.

    Args:
      like: as for `restore`.
      check_meta: called with a checkpoint's meta before its state is read;
        raises (e.g. `IncompatibleWorkdirError`) to refuse the run.

    Returns:
      `(step, state, meta)`, or None when there is no checkpoint.

    Raises:
      DamagedCheckpointError: there are checkpoints, but none reads back
        intact; they are all left in place.
    """
    damaged: list[tuple[int, str]] = []
    for step in reversed(self.steps()):
      try:
        meta = self._read_meta(step)
        check_meta(_public(meta))
        state = self._read_state(step, like, meta)
      except IncompatibleWorkdirError:
        raise
      except _Damaged as err:
        damaged.append((step, self._describe(step, err)))
        continue
      for bad_step, reason in damaged:
        moved = self._set_aside(bad_step)
        warnings.warn(
          f'{reason}; moved it to {moved} and resumed from the checkpoint of step {step}.',
          stacklevel=2,
        )
      return step, state, _public(meta)
    if damaged:
      raise DamagedCheckpointError(
        f'no checkpoint in {self.directory} can be read back intact ('
        + '; '.join(reason for _, reason in damaged)
        + '). Restore them from a backup, or move the directory away to start over.'
      )
    return None

  def _describe(self, step: int, err: Exception) -> str:
    path = os.path.join(self.directory, str(step))
    return one_line(f'the checkpoint {path} is damaged: {_reason(err, path)}')[:600]

  def _set_aside(self, step: int) -> str:
    distributed.barrier(f'jaxprune_find_damaged_{step}')  # every process names the same target
    target_dir = os.path.join(self.workdir, DAMAGED_DIR)
    os.makedirs(target_dir, exist_ok=True)
    target, n = os.path.join(target_dir, str(step)), 1
    while os.path.exists(target):
      target, n = os.path.join(target_dir, f'{step}-{n}'), n + 1
    # Process 0 moves it; every process then sees the checkpoints without it.
    if distributed.is_primary():
      os.rename(os.path.join(self.directory, str(step)), target)
    distributed.barrier(f'jaxprune_set_aside_{step}')
    self._manager.reload()
    return target

  def close(self) -> None:
    """Waits for pending writes and releases the manager."""
    self._manager.close()


# PruningState fields added after checkpoints were first written: a checkpoint
# without them resumes with each at its initial value (0).
_ADDED_FIELDS = ('moved_updates',)
_BEFORE = collections.namedtuple(
  'PruningState', [f for f in PruningState._fields if f not in _ADDED_FIELDS]
)


def _is_pruning_state(x: Any) -> bool:
  return isinstance(x, (PruningState, _BEFORE))


def _as_written_before(abstract: Any, saved: set[str]) -> Any | None:
  """`abstract` with its PruningStates as written before `_ADDED_FIELDS` existed, when
  the checkpoint's arrays (`saved`, key paths) are exactly those; else None."""
  paths = {
    jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]
  }
  added = paths - saved
  if not added or not all(p.rsplit('.', 1)[-1] in _ADDED_FIELDS for p in added):
    return None
  return jax.tree.map(
    lambda x: _BEFORE(*(getattr(x, f) for f in _BEFORE._fields)) if _is_pruning_state(x) else x,
    abstract,
    is_leaf=_is_pruning_state,
  )


def _with_added_fields(restored: Any, abstract: Any) -> Any:
  """`restored` (from `_as_written_before`) with the added fields at 0, placed as in
  `abstract`."""
  states = iter(
    [x for x in jax.tree.leaves(abstract, is_leaf=_is_pruning_state) if _is_pruning_state(x)]
  )

  def upgrade(old):
    like = next(states)
    added = {
      f: jax.device_put(
        np.zeros(getattr(like, f).shape, getattr(like, f).dtype), getattr(like, f).sharding
      )
      for f in _ADDED_FIELDS
    }
    return PruningState(**old._asdict(), **added)

  return jax.tree.map(
    lambda x: upgrade(x) if _is_pruning_state(x) else x, restored, is_leaf=_is_pruning_state
  )


def _agree(error: Exception | None, item: str) -> None:
  """Raises `_Damaged` unless every process read `item` (each reads its own shards)."""
  if distributed.agree(error is None):
    return
  if error is None:
    raise _Damaged(f'another process of the job cannot read its {item}')
  raise _Damaged(f'its {item} cannot be read: {type(error).__name__}: {error}') from error


# Tensorstore's errors: a repr of the whole TensorStore spec (dozens of lines)
# and the drivers it went through say nothing the user can act on; the root
# cause names the array and the file.
_TENSORSTORE_NOISE = re.compile(
  r'\.? ?See full TensorStore details:.*|Error opening "\w+" driver: ', re.S
)


def _reason(err: BaseException, checkpoint: str) -> str:
  """Why a checkpoint could not be read: the root error, with paths inside `checkpoint`."""
  root = err
  while root.__cause__ is not None or root.__context__ is not None:
    root = root.__cause__ or root.__context__
  if root is err:
    return str(err)
  what = str(err).split(': ', 1)[0]  # 'its state cannot be read', ...
  text = _TENSORSTORE_NOISE.sub('', str(root)).replace(checkpoint + os.sep, '')
  return f'{what}: {type(root).__name__}: {text}'


def _public(meta: Mapping[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in meta.items() if k not in (_CHECKSUMS, _META_CHECKSUM)}
