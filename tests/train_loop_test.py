"""End-to-end tests of jaxprune_train._loop.train: outputs, resume, config checks."""

import json
import os

import jax
import numpy as np
import pytest

import jaxprune
from jaxprune_train import DivergedError
from jaxprune_train import _checkpoints as checkpoints
from jaxprune_train import _data as data
from jaxprune_train import _defaults as defaults
from jaxprune_train import _loop as loop
from jaxprune_train._metrics import read_metrics
from jaxprune_train._report import format_report


def _config(**pruning):
  """A small, fast run: 32-16 MLP, 300 steps, pruning from step 60 to 200."""
  config = defaults.get_config()
  config.name = 'tiny'
  config.model.features = (32, 16)
  config.batch_size = 32
  config.optimizer.learning_rate = 1e-2
  config.num_steps = 300
  config.log_every = 10
  config.eval_every = 100
  config.checkpoint_every = 100
  config.progress_bar = False
  config.pruning = defaults.pruning_config(
    config.pruning,
    begin_pruning_step=60,
    end_pruning_step=200,
    pruning_frequency=20,
    sparsity_function_begin_step=60,
    sparsity_function_end_step=200,
    target_sparsity=0.8,
    threshold_method='exact',
    **pruning,
  )
  return config


def _assert_trees_equal(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module', autouse=True)
def compilation_cache(tmp_path_factory):
  """Compiles each distinct train step once: the runs below repeat the same one."""
  options = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs')
  before = {name: getattr(jax.config, name) for name in options}
  jax.config.update(options[0], str(tmp_path_factory.mktemp('jax_cache')))
  jax.config.update(options[1], 0)
  yield
  for name, value in before.items():
    jax.config.update(name, value)
  jax.clear_caches()  # this module's compiled steps: the worker's next tests do not need them


@pytest.fixture(scope='module')
def finished(tmp_path_factory, compilation_cache):
  del compilation_cache
  """One uninterrupted run, shared by the tests that only read its outputs."""
  workdir = str(tmp_path_factory.mktemp('run'))
  return loop.train(_config(), workdir)


@pytest.mark.slow
def test_outputs_exist(finished):
  names = set(os.listdir(finished.workdir))
  assert {
    'config.json',
    'metrics.jsonl',
    'report.txt',
    'checkpoints',
    'tensorboard',
    'sparsity.png',
    'accuracy.png',
    'layer_sparsity.png',
  } <= names
  assert sorted(os.listdir(os.path.join(finished.workdir, 'checkpoints'))) == ['200', '300']
  with open(os.path.join(finished.workdir, 'config.json')) as f:
    assert json.load(f)['pruning']['target_sparsity'] == 0.8


def test_final_sparsity_is_exactly_the_exact_methods_count(finished):
  params = finished.state.params
  # threshold_method='exact' keeps round(N * (1 - 0.8)) weights of each kernel:
  # 64*32 = 2048 -> 410 (409.6), 32*16 = 512 -> 102 (102.4), 16*10 = 160 -> 32.
  expected = {'Dense_0': 410, 'Dense_1': 102, 'Dense_2': 32}
  for layer, kept in expected.items():
    assert np.count_nonzero(params[layer]['kernel']) == kept
    assert np.count_nonzero(params[layer]['bias']) == params[layer]['bias'].size
  masks = jaxprune.get_masks(finished.state.opt_state)
  for layer in expected:
    kernel = np.asarray(params[layer]['kernel'])
    assert np.array_equal(kernel != 0, np.asarray(masks[layer]['kernel']))
  leaves = {leaf.name: leaf for leaf in finished.report.leaves}
  assert leaves['Dense_1/kernel'].nonzero == 102
  assert leaves['Dense_1/kernel'].achieved == pytest.approx(1 - 102 / 512)
  assert leaves['Dense_1/kernel'].target == 0.8
  # 2048 + 512 + 160 kernel weights and 32 + 16 + 10 biases.
  assert finished.report.total_params == 2720 + 58
  assert finished.report.total_nonzero == 410 + 102 + 32 + 58


def test_metrics_follow_the_schedule(finished):
  history = read_metrics(finished.workdir)
  assert history == finished.history
  train = {r['step']: r for r in history if 'loss' in r}
  assert sorted(train) == list(range(10, 301, 10))
  # Zhu & Gupta: s(t) = 0.8 * (1 - (1 - (t - 60) / 140) ** 3), evaluated at the
  # step of the last update call (t = step - 1).
  for step in (100, 150, 250):
    t = step - 1
    expected = 0.8 * (1 - (1 - min(max((t - 60) / 140, 0), 1)) ** 3)
    assert train[step]['target_sparsity'] == pytest.approx(expected, abs=1e-6)
  assert train[50]['achieved_sparsity'] == 0.0
  assert train[300]['achieved_sparsity'] == pytest.approx(1 - 544 / 2720)
  assert train[300]['Dense_2/kernel/sparsity'] == pytest.approx(1 - 32 / 160)
  assert train[300]['Dense_2/kernel/threshold'] > 0
  tests = [r['step'] for r in history if 'test_accuracy' in r]
  assert tests == [100, 200, 300]
  [dense] = [r for r in history if 'dense_test_accuracy' in r]
  assert dense['step'] == 60
  assert finished.report.dense_accuracy == dense['dense_test_accuracy']
  assert finished.report.final_accuracy == history[-1]['test_accuracy']
  # Digits are easy: even this tiny model is far above chance (10%).
  assert finished.report.final_accuracy > 0.85


@pytest.mark.slow
def test_interrupted_and_resumed_runs_equal_the_uninterrupted_one(finished, tmp_path):
  workdir = str(tmp_path / 'resumed')

  def crash_at(step_to_crash, error):
    def on_step(step, state):
      del state
      if step == step_to_crash:
        raise error

    return on_step

  # A crash at step 170: the newest checkpoint is step 100 and is kept.
  with pytest.raises(RuntimeError):
    loop.train(_config(), workdir, on_step=crash_at(170, RuntimeError('boom')))
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['100']
  # Ctrl-C at step 250 (after resuming from 100): the state is saved as it is.
  with pytest.raises(KeyboardInterrupt):
    loop.train(_config(), workdir, on_step=crash_at(250, KeyboardInterrupt()))
  assert '250' in os.listdir(os.path.join(workdir, 'checkpoints'))
  resumed = loop.train(_config(), workdir)
  _assert_trees_equal(resumed.state, finished.state)
  # The history is one clean copy of the uninterrupted run's.
  assert read_metrics(workdir) == read_metrics(finished.workdir)
  assert resumed.report == finished.report


def test_incompatible_config_is_refused_and_nothing_is_overwritten(finished):
  before = sorted(os.listdir(os.path.join(finished.workdir, 'checkpoints')))
  changed = _config()
  changed.model.features = (64, 16)
  with pytest.raises(ValueError, match=r'config.model.features: \[32, 16\] in the saved run'):
    loop.train(changed, finished.workdir)
  assert sorted(os.listdir(os.path.join(finished.workdir, 'checkpoints'))) == before
  with open(os.path.join(finished.workdir, 'config.json')) as f:
    assert json.load(f)['model']['features'] == [32, 16]


@pytest.mark.slow
def test_extending_a_finished_run_continues_it(tmp_path):
  config = _config()
  config.num_steps = 100
  workdir = str(tmp_path / 'extend')
  loop.train(config, workdir)
  config.num_steps = 120
  longer = loop.train(config, workdir)
  assert int(longer.state.step) == 120
  assert [r['step'] for r in read_metrics(workdir) if 'loss' in r][-3:] == [100, 110, 120]


def test_dense_run_without_workdir_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = _config()
  config.prune = False
  config.num_steps = 50
  result = loop.train(config)
  assert result.workdir is None and os.listdir(tmp_path) == []
  assert result.report.leaves == [] and result.report.dense_accuracy is None
  for layer in ('Dense_0', 'Dense_1', 'Dense_2'):
    kernel = result.state.params[layer]['kernel']
    assert np.count_nonzero(kernel) == kernel.size
  assert 'achieved_sparsity' not in result.history[-1]


@pytest.mark.slow
def test_block_config_prunes_whole_blocks():
  config = _config(block_dims_map=('Dense_0/kernel:4x4',))
  config.num_steps = 210
  result = loop.train(config)
  kernel = np.asarray(result.state.params['Dense_0']['kernel'])
  blocks = np.abs(kernel).reshape(16, 4, 8, 4).transpose(0, 2, 1, 3).reshape(128, 16)
  kept = np.all(blocks != 0, axis=1)
  assert np.array_equal(kept, np.any(blocks != 0, axis=1))  # each block all or nothing
  # exact method on the 128 pooled scores: keep round(128 * 0.2) = 26 blocks.
  assert kept.sum() == 26
  leaf = result.report.leaves[0]
  assert leaf.name == 'Dense_0/kernel' and leaf.block == (4, 4) and leaf.nonzero == 26 * 16


def test_global_and_nm_runs_report_their_own_rules():
  config = _config(global_pruning=True, nm_sparsity_map=('Dense_2/kernel:2:4',))
  config.num_steps = 210
  result = loop.train(config)
  kept = {leaf.name: leaf.nonzero for leaf in result.report.leaves}
  # One exact threshold over Dense_0 and Dense_1 together keeps
  # round((2048 + 512) * 0.2) = 512 of them; Dense_2 keeps 2 of every 4 of 160.
  assert kept['Dense_0/kernel'] + kept['Dense_1/kernel'] == 512
  assert kept['Dense_2/kernel'] == 80
  assert [(leaf.target, leaf.pattern) for leaf in result.report.leaves] == [
    (0.8, '1x1'),
    (0.8, '1x1'),
    (0.5, '2:4'),
  ]
  assert result.report.global_target == 0.8
  text = format_report(result.report)
  assert 'global pruning: one threshold across the pruned leaves; the target 0.800' in text


@pytest.mark.slow
@pytest.mark.parametrize(
  'log_every, found',
  [
    # Found when the loss is logged (step 50), before the checkpoint of step 60.
    (10, 'at step 50 the training loss is nan'),
    # Nothing is logged before step 60: found when that checkpoint is about to be written.
    (100, 'at step 60 the params or the optimizer state hold NaN or Inf values'),
  ],
)
def test_a_diverging_run_never_checkpoints_non_finite_state(tmp_path, log_every, found):
  digits = data.load_digits()
  path = str(tmp_path / 'digits.npz')
  splits = {
    'x_train': digits.x_train,
    'y_train': digits.y_train,
    'x_test': digits.x_test,
    'y_test': digits.y_test,
  }
  np.savez(path, **splits)
  config = _config()
  config.data.name, config.data.path = 'npz', path
  config.num_steps, config.checkpoint_every, config.log_every = 40, 20, log_every
  workdir = str(tmp_path / 'run')
  good = loop.train(config, workdir).state
  # The same file, now with inputs near float32's largest value: the first
  # layer overflows to +-inf, the loss and then the params to NaN.
  np.savez(path, **{**splits, 'x_train': np.full_like(digits.x_train, 3e38)})
  config.num_steps = 80
  with pytest.raises(DivergedError) as err:
    loop.train(config, workdir)
  assert str(err.value) == (
    f'training diverged: {found} (all finite at step 40); '
    'config.optimizer.learning_rate=0.01 is likely too high. Nothing non-finite was saved: '
    'the newest checkpoint (step 40) is from before. Train again with a lower learning rate '
    'and a new --workdir.'
  )
  # Step 40 is still the newest checkpoint, and it is the good state.
  checkpointer = checkpoints.Checkpointer(workdir)
  assert checkpointer.steps() == [20, 40]
  restored, _ = checkpointer.restore(40, good)
  checkpointer.close()
  _assert_trees_equal(restored, good)
