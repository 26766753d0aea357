"""`loop.train` on inputs that only fail once the model exists (one-line ConfigErrors), and
on workdirs whose files were changed by hand."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
import train_faults

from jaxprune_train import ConfigError
from jaxprune_train import _data as data
from jaxprune_train import _defaults as defaults
from jaxprune_train import _loop as loop
from jaxprune_train import _usage as usage
from jaxprune_train._metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module', autouse=True)
def free_compiled_steps():
  yield
  jax.clear_caches()  # this module's compiled steps: the worker's next tests do not need them


@pytest.mark.parametrize(
  'hparams, message',
  [
    (
      {'nm_sparsity': '3:7'},
      "N:M 3:7: leaf 'Dense_0/kernel' with shape (64, 32): axis 0 has 64 entries, which is not "
      'divisible by M=7',
    ),
    (
      {'layer_axes_map': ('Dense_0:2',)},
      "layer_axes_map: leaf 'Dense_0/kernel' of shape (64, 32) has 0 axes left after its 2 "
      'layer axes',
    ),
    (
      {'weight_sparsity_map': ('Dense_0:0.5', 'Dense_0/kernel:0.6')},
      "weight_sparsity_map: leaf 'Dense_0/kernel' matches several entries",
    ),
  ],
)
def test_hparams_that_do_not_fit_the_model_are_config_errors(tmp_path, hparams, message):
  config = train_faults.tiny_config(5)
  # N:M takes no target: beside the tiny config's target_sparsity=0.8 it is refused.
  base = None if 'nm_sparsity' in hparams else config.pruning
  config.pruning = defaults.pruning_config(base, **hparams)
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError) as err:
    loop.train(config, str(workdir))
  assert str(err.value).startswith(message) and '\n' not in str(err.value)
  assert not workdir.exists()


def test_a_cnn_given_flat_inputs_names_the_shape_it_takes(tmp_path):
  digits = data.load_digits()
  path = str(tmp_path / 'flat.npz')
  np.savez(
    path,
    x_train=digits.x_train.reshape(-1, 64),
    y_train=digits.y_train,
    x_test=digits.x_test.reshape(-1, 64),
    y_test=digits.y_test,
  )
  config = usage.load_config(os.path.join(REPO, 'configs', 'digits_cnn_channels.py'))
  config.data.name, config.data.path = 'npz', path
  with pytest.raises(ConfigError) as err:
    loop.train(config, str(tmp_path / 'run'))
  assert str(err.value) == (
    "model.name='cnn' takes images of shape (height, width) or (height, width, channels), "
    'but the inputs have shape (64,); reshape x_train and x_test to images (e.g. '
    "x.reshape(len(x), 8, 8, 1)), or use model.name='mlp'."
  )
  assert not (tmp_path / 'run').exists()


def _channel_config():
  config = usage.load_config(os.path.join(REPO, 'configs', 'digits_cnn_channels.py'))
  config.model.features, config.model.dense = (8, 8), 16
  config.num_steps = 40
  config.pruning = defaults.pruning_config(
    config.pruning,
    begin_pruning_step=10,
    end_pruning_step=30,
    pruning_frequency=10,
    sparsity_function_begin_step=10,
    sparsity_function_end_step=30,
  )
  config.channels.round_to = 1
  config.eval_every = config.checkpoint_every = 20
  config.progress_bar = config.tensorboard = config.plots = False
  return config


def _read(path):
  with open(path) as f:
    return f.read()


@pytest.mark.slow
def test_rerunning_a_finished_channel_run_keeps_its_one_final_record(tmp_path):
  workdir = str(tmp_path / 'run')
  loop.train(_channel_config(), workdir)
  first = read_metrics(workdir)
  report = _read(os.path.join(workdir, loop.REPORT_FILE))
  assert len([r for r in first if 'speedup' in r]) == 1
  loop.train(_channel_config(), workdir)  # a finished run: nothing to append
  assert read_metrics(workdir) == first
  assert _read(os.path.join(workdir, loop.REPORT_FILE)) == report


@pytest.mark.parametrize(
  'name, what',
  [
    ('config.json', 'config'),
    ('metrics.jsonl', 'metrics'),
    ('report.txt', 'report'),
    ('.jaxprune-train.lock', 'lock'),
  ],
)
@pytest.mark.parametrize('kind', ['directory', 'dangling link'])
def test_an_output_that_is_a_directory_or_a_dangling_link_is_one_line(tmp_path, name, what, kind):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  path = workdir / name
  if kind == 'directory':
    path.mkdir()
    (path / 'keep').write_text('user data')
    expected = (
      f'{path} is a directory, where the run keeps its {what}; move it out of the '
      'way, then run the same command again.'
    )
  else:
    target = str(tmp_path / 'unmounted' / name)
    path.symlink_to(target)
    expected = (
      f'{path} is a symbolic link to {target!r}, which does not exist; restore its '
      f'target, or remove the link to start the {what} afresh, then run the same '
      'command again.'
    )
  with pytest.raises(ConfigError) as err:
    loop.train(train_faults.tiny_config(5), str(workdir))
  assert str(err.value) == expected
  # Nothing written but the lock, nothing moved.
  assert set(os.listdir(workdir)) - {'.jaxprune-train.lock'} == {name} - {'.jaxprune-train.lock'}
  if kind == 'directory':
    assert (path / 'keep').read_text() == 'user data'
  else:
    assert os.readlink(path) == target


def _edit_json(path, **changes):
  with open(path) as f:
    saved = json.load(f)
  saved.update(changes)
  with open(path, 'w') as f:
    json.dump(saved, f)


@pytest.fixture(scope='module')
def finished_40(tmp_path_factory):
  """A finished 40-step tiny run (checkpoints at 20 and 40), copied by each test."""
  workdir = str(tmp_path_factory.mktemp('finished') / 'run')
  loop.train(train_faults.tiny_config(40), workdir)
  return workdir


def _copy(finished, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(finished, workdir)
  return workdir


@pytest.mark.slow
def test_a_config_json_changed_outside_the_job_is_repaired_from_the_checkpoint(
  finished_40, tmp_path
):
  workdir = _copy(finished_40, tmp_path)
  path = os.path.join(workdir, 'config.json')
  _edit_json(path, seed=1)  # one bit: "seed": 0 -> 1, still valid JSON
  # The run as it was trained resumes, with one warning, and the file is repaired.
  with pytest.warns(UserWarning) as warned:
    loop.train(train_faults.tiny_config(60), workdir)
  assert [str(w.message) for w in warned if 'config.json' in str(w.message)] == [
    f'{path} disagrees with the checksummed config of the checkpoint of step 40 '
    '(config.seed: 1 in the file, 0 in the checkpoint), so it was changed outside the job; '
    "rewrote it with the checkpoint's config."
  ]
  with open(path) as f:
    assert json.load(f)['seed'] == 0
  # The run with seed 1 is refused by the checkpoint, and says so the same way.
  _edit_json(path, seed=1)
  seed_1 = train_faults.tiny_config(80)
  seed_1.seed = 1
  with pytest.raises(ConfigError, match=r'config.seed: 0 in the saved run, 1 now'):
    loop.train(seed_1, workdir)


@pytest.mark.slow
def test_a_missing_metrics_file_is_named_with_the_way_to_resume(finished_40, tmp_path):
  workdir = _copy(finished_40, tmp_path)
  path = os.path.join(workdir, 'metrics.jsonl')
  os.remove(path)
  with pytest.raises(ConfigError) as err:
    loop.train(train_faults.tiny_config(60), workdir)
  assert str(err.value) == (
    f'{path} is missing, but the run resumes from its checkpoint of step 40: the history up '
    'to that step would be lost. Restore the file from a backup, or create an empty one '
    '(metrics.jsonl) to resume without it.'
  )
  assert not os.path.exists(path)
  open(path, 'w').close()  # the way out the message gives
  result = loop.train(train_faults.tiny_config(60), workdir)
  assert int(result.state.step) == 60
  assert min(r['step'] for r in read_metrics(workdir)) == 50
