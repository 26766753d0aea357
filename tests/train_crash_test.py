"""Crash safety of the main job: kills, full disks and damaged files in the middle of each write.

Each test breaks a run at one point (SIGKILL inside a checkpoint save or a file
write, ENOSPC half-way through a write, a flipped or cut file), checks that
what was there before is still whole, then resumes and checks that the run
ends exactly as an uninterrupted one: the same final state, bit for bit, the
same metrics history and the same report.
"""

import json
import os
import shutil
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
import train_faults

from jaxprune.train import loop
from jaxprune.train.errors import StorageError
from jaxprune.train.metrics import read_metrics

FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train_faults.py')


def _arrays(state):
  flat, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(state))
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def _read(path):
  with open(path) as f:
    return f.read()


@pytest.fixture(scope='module', autouse=True)
def compilation_cache(tmp_path_factory):
  """Compiles the tiny run's step once for all the in-process runs below."""
  options = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs')
  before = {name: getattr(jax.config, name) for name in options}
  jax.config.update(options[0], str(tmp_path_factory.mktemp('jax_cache')))
  jax.config.update(options[1], 0)
  yield
  for name, value in before.items():
    jax.config.update(name, value)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted 60-step run: final arrays, metrics, report."""
  workdir = str(tmp_path_factory.mktemp('reference'))
  result = loop.train(train_faults.tiny_config(), workdir)
  return {'arrays': _arrays(result.state), 'metrics': read_metrics(workdir),
          'report': _read(os.path.join(workdir, loop.REPORT_FILE))}


def _assert_same_run(workdir, arrays, reference):
  assert arrays.keys() == reference['arrays'].keys()
  for name, value in arrays.items():
    np.testing.assert_array_equal(value, reference['arrays'][name], err_msg=name)
  assert read_metrics(workdir) == reference['metrics']
  assert _read(os.path.join(workdir, loop.REPORT_FILE)) == reference['report']


def _child(workdir, fault, num_steps=60):
  """Runs the tiny config in a subprocess under `fault`; the final arrays, or None if killed."""
  out = os.path.join(os.path.dirname(workdir), os.path.basename(workdir) + '.npz')
  result = subprocess.run([sys.executable, FAULTS, workdir, out, fault, str(num_steps)],
                          capture_output=True, text=True, timeout=600)
  if fault.startswith('kill'):
    assert result.returncode == -9, result.stderr[-3000:]
    return None
  assert result.returncode == 0, result.stderr[-3000:]
  with np.load(out) as saved:
    return dict(saved)


def _committed(workdir):
  return sorted(name for name in os.listdir(os.path.join(workdir, 'checkpoints'))
                if name.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize('point, at, left', [
    ('tmp-dir', 2, ['20']),   # step 40's temporary directory was just made
    ('commit', 2, ['20']),    # step 40's arrays are written, not renamed into place
    ('item', 2, ['20']),      # one of its two items is committed inside the temporary directory
    ('renamed', 2, ['20', '40']),  # committed; killed before the save returned
    ('commit', 1, []),        # the first checkpoint: nothing to fall back to
])
def test_a_kill_inside_a_checkpoint_save(tmp_path, reference, point, at, left):
  workdir = str(tmp_path / 'run')
  _child(workdir, f'kill-checkpoint:{point}:{at}')
  assert _committed(workdir) == left
  _assert_same_run(workdir, _child(workdir, 'none'), reference)


@pytest.mark.slow
def test_a_kill_while_metrics_are_appended_and_then_rewritten(tmp_path, reference):
  workdir = str(tmp_path / 'run')
  # Writes: the (empty) file, then the records of step 10, dense accuracy at 10,
  # step 20 (train, test; then the checkpoint), step 30: that 6th write is cut.
  _child(workdir, 'kill-write:metrics.jsonl:6')
  with open(os.path.join(workdir, 'metrics.jsonl'), 'rb') as f:
    torn = f.read()
  assert torn.count(b'\n') == 4 and not torn.endswith(b'\n')
  # The resumed run rewrites the file without the records after its checkpoint
  # (step 20); killed half-way through that rewrite, the file is as it was.
  _child(workdir, 'kill-write:metrics.jsonl:1')
  with open(os.path.join(workdir, 'metrics.jsonl'), 'rb') as f:
    assert f.read() == torn
  _assert_same_run(workdir, _child(workdir, 'none'), reference)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['config.json', 'report.txt'])
def test_a_kill_while_a_file_is_replaced_keeps_the_old_one(tmp_path, reference, name):
  workdir = str(tmp_path / 'run')
  _child(workdir, 'none', num_steps=40)
  before = _read(os.path.join(workdir, name))
  # Extending the run to 60 steps rewrites config.json before training and
  # report.txt after it: each is killed half-way through its write.
  _child(workdir, f'kill-write:{name}:1')
  assert _read(os.path.join(workdir, name)) == before
  if name == 'config.json':
    assert json.loads(before)['num_steps'] == 40
  _assert_same_run(workdir, _child(workdir, 'none'), reference)


def _train_recording_warnings(config, workdir):
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter('always')
    result = loop.train(config, workdir)
  return result, [str(w.message) for w in warned]


@pytest.mark.parametrize('name, at', [
    ('metrics.jsonl', 6),   # an append after the checkpoint of step 20: the line is cut short
    ('config.json', 1),     # replaced atomically before training
    ('report.txt', 1),      # replaced atomically after training
])
def test_a_full_disk_half_way_through_a_write(tmp_path, reference, name, at):
  workdir = str(tmp_path / 'run')
  with train_faults.fail_writes(name, at), pytest.raises(StorageError) as err:
    loop.train(train_faults.tiny_config(), workdir)
  message = str(err.value)
  assert message.startswith('cannot write the ') and 'No space left on device [errno 28]' in message
  assert message.endswith('free some space, then run the same command to resume.')
  assert '\n' not in message
  if name == 'config.json':
    assert 'no checkpoint was written yet' in message
    assert not os.path.exists(os.path.join(workdir, 'config.json'))
  else:
    assert f'the newest checkpoint is step {20 if name == "metrics.jsonl" else 60}' in message
  result, messages = _train_recording_warnings(train_faults.tiny_config(), workdir)
  cut = [m for m in messages if 'cut short by an interrupted write' in m]
  assert len(cut) == (name == 'metrics.jsonl'), messages
  _assert_same_run(workdir, _arrays(result.state), reference)


def test_a_cut_or_damaged_metrics_line_is_dropped_on_resume(tmp_path, reference):
  workdir = str(tmp_path / 'run')
  loop.train(train_faults.tiny_config(40), workdir)
  path = os.path.join(workdir, 'metrics.jsonl')
  with open(path) as f:
    lines = f.readlines()
  lines[2] = lines[2][:5] + '\x00garbage\n'
  with open(path, 'w') as f:
    f.writelines([*lines, '{"step": 40, "lo'])
  result, messages = _train_recording_warnings(train_faults.tiny_config(), workdir)
  damaged, cut = [m for m in messages if 'metrics.jsonl' in m]
  assert damaged.startswith(f'{path}: line 3 is damaged (')
  assert damaged.endswith(r"""); dropped it: b'{"ste\x00garbage'""")
  assert cut == (f"{path}: line {len(lines) + 1} is cut short by an interrupted write; dropped "
                 "it: b'{\"step\": 40, \"lo'")
  # The damaged record is gone; the rest of the history is the uninterrupted run's.
  assert read_metrics(workdir) == reference['metrics'][:2] + reference['metrics'][3:]
  for name, value in _arrays(result.state).items():
    np.testing.assert_array_equal(value, reference['arrays'][name], err_msg=name)


def _damage(path, mode):
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    if mode == 'cut':
      f.truncate(size // 2)
    elif size:
      f.seek(size // 2)
      byte = f.read(1)
      f.seek(size // 2)
      f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.slow
def test_every_file_of_the_newest_checkpoint_flipped_or_cut(tmp_path, reference):
  """A flipped byte or a cut file anywhere in the newest checkpoint never changes the result."""
  base = str(tmp_path / 'base')
  loop.train(train_faults.tiny_config(40), base)
  newest = os.path.join(base, 'checkpoints', '40')
  names = sorted(os.path.relpath(os.path.join(root, f), newest)
                 for root, _, fs in os.walk(newest) for f in fs)
  assert any(name.startswith('state/ocdbt.process_0/d/') for name in names), names
  caught = set()
  for name in names:
    for mode in ('flip', 'cut'):
      workdir = str(tmp_path / 'case')
      shutil.rmtree(workdir, ignore_errors=True)
      shutil.copytree(base, workdir)
      _damage(os.path.join(workdir, 'checkpoints', '40', name), mode)
      result, messages = _train_recording_warnings(train_faults.tiny_config(), workdir)
      damaged = [m for m in messages if 'is damaged' in m]
      if damaged:
        caught.add((name, mode))
        assert damaged[0].startswith(
            f'the checkpoint {os.path.join(workdir, "checkpoints", "40")} is damaged: '), damaged
        assert damaged[0].endswith('and resumed from the checkpoint of step 20.')
        assert os.listdir(os.path.join(workdir, 'damaged_checkpoints')) == ['40']
      _assert_same_run(workdir, _arrays(result.state), reference)
  # Every file holding array data is caught when cut or flipped.
  for name in names:
    if name.startswith('state/ocdbt.process_0/d/'):
      assert {(name, 'flip'), (name, 'cut')} <= caught, (name, sorted(caught))
