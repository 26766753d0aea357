"""Tests for jaxprune_train._checkpoints: orbax round trip, checksums, fallback, commits."""

import asyncio
import errno
import os
import shutil
import time
import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from orbax.checkpoint._src.path import atomicity

import jaxprune
from jaxprune_train import (
  DamagedCheckpointError,
  IncompatibleWorkdirError,
  StorageError,
)
from jaxprune_train import _checkpoints as checkpoints


class _Inner(NamedTuple):
  count: Any
  masks: Any
  thresholds: Any


class _State(NamedTuple):
  step: Any
  params: Any
  opt_state: Any


def _state(scale):
  params = {'Dense_0': {'kernel': jnp.arange(6.0).reshape(2, 3) * scale, 'bias': jnp.ones(3)}}
  inner = _Inner(
    jnp.int32(4),
    {'Dense_0': {'kernel': jnp.array([[True, False, True]] * 2), 'bias': None}},
    {'Dense_0': {'kernel': jnp.float32(0.25), 'bias': None}},
  )
  return _State(jnp.int32(7), params, (inner, ()))


def _kernel(state):
  return np.asarray(state.params['Dense_0']['kernel'])


def _no_check(meta):
  del meta


def test_round_trip_is_exact_and_keeps_structure(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  assert ckpt.latest_step() is None
  state = _state(1.5)
  ckpt.save(7, state, {'config': {'a': 1}, 'dense_accuracy': 0.93})
  ckpt.close()
  reopened = checkpoints.Checkpointer(str(tmp_path))
  assert reopened.latest_step() == 7
  restored, meta = reopened.restore(7, _state(0.0))
  assert meta == {'config': {'a': 1}, 'dense_accuracy': 0.93}
  assert isinstance(restored, _State) and isinstance(restored.opt_state[0], _Inner)
  assert restored.opt_state[0].masks['Dense_0']['bias'] is None
  assert restored.opt_state[0].masks['Dense_0']['kernel'].dtype == jnp.bool_
  np.testing.assert_array_equal(_kernel(restored), np.arange(6.0).reshape(2, 3) * 1.5)
  assert int(restored.step) == 7
  assert float(restored.opt_state[0].thresholds['Dense_0']['kernel']) == 0.25
  reopened.close()


def test_checksums_are_crc32_of_dtype_shape_and_bytes():
  sums = checkpoints.state_checksums(_state(2.0))
  kernel = np.arange(6.0, dtype=np.float32).reshape(2, 3) * 2
  header = zlib.crc32(b'<f4(2, 3)')
  assert sums[".params['Dense_0']['kernel']"] == zlib.crc32(kernel.tobytes(), header)
  assert sums['.step'] == zlib.crc32(np.int32(7).tobytes(), zlib.crc32(b'<i4()'))
  assert len(sums) == 6  # step, kernel, bias, count, mask, threshold (None leaves have none)


def test_keeps_only_the_newest_and_ignores_unfinished_writes(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {})
  ckpt.save(3, _state(99.0), {})  # an existing step is never overwritten
  ckpt.close()
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '3']
  # What a save killed half way leaves behind: orbax's temporary directory.
  os.makedirs(tmp_path / 'checkpoints' / '4.orbax-checkpoint-tmp' / 'state')
  reopened = checkpoints.Checkpointer(str(tmp_path), max_to_keep=2)
  assert reopened.steps() == [2, 3]
  step, restored, _ = reopened.restore_newest(_state(0.0), _no_check)
  assert step == 3
  np.testing.assert_array_equal(_kernel(restored), np.arange(6.0).reshape(2, 3) * 3)
  reopened.close()


@pytest.mark.parametrize('keep', [0, -1, 1.5, True])
def test_keeping_no_checkpoint_is_refused(tmp_path, keep):
  with pytest.raises(ValueError, match=rf'max_checkpoints_to_keep={keep!r}: must be an integer'):
    checkpoints.Checkpointer(str(tmp_path), max_to_keep=keep)


def _swap_states(directory, a, b):
  """Swaps the state items of two checkpoints: valid files, wrong values."""
  shutil.move(directory / str(a) / 'state', directory / 'tmp_state')
  shutil.move(directory / str(b) / 'state', directory / str(a) / 'state')
  shutil.move(directory / 'tmp_state', directory / str(b) / 'state')


def test_arrays_that_do_not_match_their_checksums_fall_back_to_the_previous(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), max_to_keep=3)
  for step, scale in ((1, 1.0), (2, 2.0), (3, 3.0)):
    ckpt.save(step, _state(scale), {'scale': scale})
  ckpt.close()
  directory = tmp_path / 'checkpoints'
  # Orbax reads the swapped items without complaint; only the checksums notice.
  _swap_states(directory, 2, 3)
  reopened = checkpoints.Checkpointer(str(tmp_path), max_to_keep=3)
  with pytest.raises(DamagedCheckpointError) as err:
    reopened.restore(3, _state(0.0))
  assert str(err.value) == (
    f'the checkpoint {directory / "3"} is damaged: array '
    ".params['Dense_0']['kernel'] does not match the checksum written "
    'with it'
  )
  with pytest.warns(UserWarning) as warned:
    step, restored, meta = reopened.restore_newest(_state(0.0), _no_check)
  assert step == 1 and meta == {'scale': 1.0}
  np.testing.assert_array_equal(_kernel(restored), np.arange(6.0).reshape(2, 3))
  messages = [str(w.message) for w in warned]
  damaged = tmp_path / 'damaged_checkpoints'
  assert messages == [
    f"the checkpoint {directory / '3'} is damaged: array .params['Dense_0']['kernel'] "
    f'does not match the checksum written with it; moved it to {damaged / "3"} and resumed '
    'from the checkpoint of step 1.',
    f"the checkpoint {directory / '2'} is damaged: array .params['Dense_0']['kernel'] "
    f'does not match the checksum written with it; moved it to {damaged / "2"} and resumed '
    'from the checkpoint of step 1.',
  ]
  assert sorted(os.listdir(directory)) == ['1'] and sorted(os.listdir(damaged)) == ['2', '3']
  # The run saves its new checkpoints of those steps in their place.
  reopened.save(2, _state(2.0), {})
  assert reopened.steps() == [1, 2]
  reopened.close()


def test_a_damaged_meta_item_is_found(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _state(1.0), {'dense_accuracy': 0.5})
  ckpt.save(2, _state(2.0), {'dense_accuracy': 0.5})
  ckpt.close()
  meta_file = tmp_path / 'checkpoints' / '2' / 'meta' / 'metadata'
  meta_file.write_text(meta_file.read_text().replace('0.5', '0.9'))  # still valid JSON
  with pytest.warns(UserWarning, match='its meta item does not match the checksum'):
    step, _, meta = checkpoints.Checkpointer(str(tmp_path)).restore_newest(_state(0.0), _no_check)
  assert (step, meta) == (1, {'dense_accuracy': 0.5})


def test_when_no_checkpoint_is_good_nothing_is_moved(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _state(1.0), {})
  ckpt.save(2, _state(2.0), {})
  ckpt.close()
  directory = tmp_path / 'checkpoints'
  _swap_states(directory, 1, 2)
  with pytest.raises(DamagedCheckpointError) as err:
    checkpoints.Checkpointer(str(tmp_path)).restore_newest(_state(0.0), _no_check)
  message = str(err.value)
  assert message.startswith(
    f'no checkpoint in {directory} can be read back intact (the '
    f'checkpoint {directory / "2"} is damaged: array'
  )
  assert f'the checkpoint {directory / "1"} is damaged' in message
  assert message.endswith('Restore them from a backup, or move the directory away to start over.')
  assert sorted(os.listdir(directory)) == ['1', '2']
  assert not os.path.exists(tmp_path / 'damaged_checkpoints')


def test_a_refused_config_is_not_taken_for_damage(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _state(1.0), {'config': {'seed': 0}})
  ckpt.close()

  def refuse(meta):
    raise IncompatibleWorkdirError(f'seed was {meta["config"]["seed"]}')

  with pytest.raises(IncompatibleWorkdirError, match='seed was 0'):
    checkpoints.Checkpointer(str(tmp_path)).restore_newest(_state(0.0), refuse)
  assert os.listdir(tmp_path / 'checkpoints') == ['1']


@pytest.mark.slow
def test_save_returns_only_once_the_checkpoint_is_committed(tmp_path, monkeypatch):
  real_finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def slow_finalize(self):
    # The commit runs in orbax's background thread; make it late.
    await asyncio.sleep(0.5)
    await real_finalize(self)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', slow_finalize)
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  start = time.monotonic()
  ckpt.save(5, _state(1.0), {})
  # What a crash right after `save` returns would leave: a committed checkpoint.
  assert os.listdir(tmp_path / 'checkpoints') == ['5'], time.monotonic() - start
  assert os.path.exists(tmp_path / 'checkpoints' / '5' / 'commit_success.txt')
  ckpt.close()


def test_a_full_disk_during_a_save_keeps_the_older_checkpoints(tmp_path, monkeypatch):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _state(1.0), {})

  async def disk_full(self):
    raise OSError(errno.ENOSPC, 'No space left on device', str(self.get()))

  # The arrays of step 2 are written; committing them fails.
  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', disk_full)
  with pytest.raises(StorageError) as err:
    ckpt.save(2, _state(2.0), {})
  assert str(err.value) == (
    f'cannot write the checkpoint of step 2 to {tmp_path / "checkpoints"}: No space left on '
    'device [errno 28]; older checkpoints are intact (the newest is step 1); free some space, '
    'then run the same command to resume.'
  )
  monkeypatch.undo()
  reopened = checkpoints.Checkpointer(str(tmp_path))
  step, restored, _ = reopened.restore_newest(_state(0.0), _no_check)
  assert step == 1
  np.testing.assert_array_equal(_kernel(restored), np.arange(6.0).reshape(2, 3))
  reopened.save(2, _state(2.0), {})  # the same step saves fine once there is space
  assert reopened.steps() == [1, 2]
  reopened.close()


def test_a_checkpoint_written_before_moved_updates_resumes_it_at_zero(tmp_path):
  """PruningState gained `moved_updates` after checkpoints were first written: such a
  checkpoint restores into today's state with it at 0, not as a damaged checkpoint."""
  params = {'kernel': jnp.arange(8.0).reshape(2, 4)}
  tx = optax.chain(optax.sgd(0.1), jaxprune.pruning(jaxprune.get_pruning_hparams()))
  today = tx.init(params)
  pruning_state = today[1]
  before = checkpoints._BEFORE(*pruning_state[:-1])  # the fields written then
  assert before._fields + ('moved_updates',) == jaxprune.PruningState._fields
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(3, {'params': params, 'opt_state': (today[0], before)}, {'config': {}})
  like = {'params': params, 'opt_state': today}
  restored, _ = ckpt.restore(3, jax.eval_shape(lambda: like))
  state = restored['opt_state'][1]
  assert isinstance(state, jaxprune.PruningState)
  assert int(state.moved_updates) == 0 and state.moved_updates.dtype == jnp.int32
  assert state.masks['kernel'].shape == (2, 4)
  np.testing.assert_array_equal(state.masks['kernel'], pruning_state.masks['kernel'])
  # A checkpoint missing another array is still damaged.
  ckpt.save(4, {'params': {}, 'opt_state': (today[0], before)}, {'config': {}})
  with pytest.raises(DamagedCheckpointError):
    ckpt.restore(4, jax.eval_shape(lambda: like))
  ckpt.close()
