"""Tests for jaxprune.train.checkpoints: orbax round trip, atomicity, config checks."""

import json
import os
from typing import Any, NamedTuple

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxprune.train import checkpoints


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
  inner = _Inner(jnp.int32(4), {'Dense_0': {'kernel': jnp.array([[True, False, True]] * 2),
                                            'bias': None}},
                 {'Dense_0': {'kernel': jnp.float32(0.25), 'bias': None}})
  return _State(jnp.int32(7), params, (inner, ()))


def _config(**changes):
  config = ml_collections.ConfigDict({
      'name': 'run', 'num_steps': 100, 'eval_every': 10, 'seed': 0,
      'pruning': {'target_sparsity': 0.9, 'weight_sparsity_map': ('',)}})
  for key, value in changes.items():
    node = config
    *parents, leaf = key.split('.')
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


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
  np.testing.assert_array_equal(restored.params['Dense_0']['kernel'],
                                np.arange(6.0).reshape(2, 3) * 1.5)
  assert int(restored.step) == 7
  assert float(restored.opt_state[0].thresholds['Dense_0']['kernel']) == 0.25
  reopened.close()


def test_keeps_only_the_newest_and_ignores_unfinished_writes(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {})
  ckpt.save(3, _state(99.0), {})  # an existing step is never overwritten
  ckpt.close()
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '3']
  # What a save killed half way leaves behind: orbax's temporary directory.
  os.makedirs(tmp_path / 'checkpoints' / '4.orbax-checkpoint-tmp-1700000000000000' / 'state')
  reopened = checkpoints.Checkpointer(str(tmp_path), max_to_keep=2)
  assert reopened.latest_step() == 3
  restored, _ = reopened.restore(3, _state(0.0))
  np.testing.assert_array_equal(restored.params['Dense_0']['kernel'],
                                np.arange(6.0).reshape(2, 3) * 3)
  reopened.close()


def test_config_differences_flattens_and_ignores_resumable_fields():
  saved = checkpoints.config_to_json(_config())
  current = checkpoints.config_to_json(
      _config(**{'num_steps': 500, 'pruning.target_sparsity': 0.95}))
  assert checkpoints.config_differences(saved, current) == [('pruning.target_sparsity', 0.9, 0.95)]
  current['extra'] = 1
  assert checkpoints.config_differences(saved, current)[0] == ('extra', '<absent>', 1)


def test_workdir_config_is_recorded_then_checked(tmp_path):
  workdir = str(tmp_path / 'run')
  checkpoints.check_workdir_config(workdir, _config())
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['pruning']['weight_sparsity_map'] == ['']
  checkpoints.check_workdir_config(workdir, _config())            # same config: fine
  checkpoints.check_workdir_config(workdir, _config(num_steps=300))  # longer run: fine
  with pytest.raises(ValueError) as err:
    checkpoints.check_workdir_config(
        workdir, _config(**{'seed': 1, 'pruning.weight_sparsity_map': ('Dense_0:0.5',)}))
  message = str(err.value)
  assert 'config.seed: 0 in the saved run, 1 now' in message
  assert "config.pruning.weight_sparsity_map: [''] in the saved run, ['Dense_0:0.5'] now" in message
  assert 'new --workdir' in message
  # The refused config did not replace the recorded one.
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['seed'] == 0
