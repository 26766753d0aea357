"""Crash safety of the main job: kills, full disks and damaged files in the middle of each write.

Each test breaks a run at one point (SIGKILL inside a checkpoint save or a file
write, ENOSPC half-way through a write, a flipped or cut file), checks that
what was there before is still whole, then resumes and checks that the run
ends exactly as an uninterrupted one: the same final state, bit for bit, the
same metrics history and the same report.
"""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
import train_faults

from jaxprune_train import StorageError
from jaxprune_train import _checkpoints as checkpoints
from jaxprune_train import _loop as loop
from jaxprune_train._metrics import read_metrics

FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train_faults.py')


def _arrays(state):
  flat, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(state))
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def _read(path):
  with open(path) as f:
    return f.read()


@pytest.fixture(scope='module', autouse=True)
def compilation_cache(tmp_path_factory):
  """Compiles the tiny run's step once, for this process and the killed subprocesses."""
  cache = str(tmp_path_factory.mktemp('jax_cache'))
  options = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs')
  before = {name: getattr(jax.config, name) for name in options}
  jax.config.update(options[0], cache)
  jax.config.update(options[1], 0)
  yield cache
  for name, value in before.items():
    jax.config.update(name, value)
  jax.clear_caches()  # this module's compiled steps: the worker's next tests do not need them


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted 60-step run: final arrays, metrics, report."""
  workdir = str(tmp_path_factory.mktemp('reference'))
  result = loop.train(train_faults.tiny_config(), workdir)
  return {
    'arrays': _arrays(result.state),
    'metrics': read_metrics(workdir),
    'report': _read(os.path.join(workdir, loop.REPORT_FILE)),
  }


def _assert_same_run(workdir, arrays, reference):
  assert arrays.keys() == reference['arrays'].keys()
  for name, value in arrays.items():
    np.testing.assert_array_equal(value, reference['arrays'][name], err_msg=name)
  assert read_metrics(workdir) == reference['metrics']
  assert _read(os.path.join(workdir, loop.REPORT_FILE)) == reference['report']


def _kill(workdir, fault, cache, num_steps=60):
  """Runs the tiny config in a subprocess that `fault` kills (SIGKILL) part way."""
  env = dict(
    os.environ, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0'
  )
  result = subprocess.run(
    [sys.executable, FAULTS, workdir, fault, str(num_steps)],
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
  )
  assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]


def _resume(workdir, reference):
  """Resumes the run in this process and checks it ends as the uninterrupted one."""
  result = loop.train(train_faults.tiny_config(), workdir)
  _assert_same_run(workdir, _arrays(result.state), reference)


def _committed(workdir):
  return sorted(name for name in os.listdir(os.path.join(workdir, 'checkpoints')) if name.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize(
  'point, at, left',
  [
    ('commit', 2, ['20']),  # step 40's arrays are written, not renamed into place
    ('item', 2, ['20']),  # one of its two items is committed inside the temporary directory
    ('renamed', 2, ['20', '40']),  # committed; killed before the save returned
    ('commit', 1, []),  # the first checkpoint: nothing to fall back to
  ],
)
def test_a_kill_inside_a_checkpoint_save(tmp_path, compilation_cache, reference, point, at, left):
  workdir = str(tmp_path / 'run')
  _kill(workdir, f'kill-checkpoint:{point}:{at}', compilation_cache)
  assert _committed(workdir) == left
  _resume(workdir, reference)


@pytest.mark.slow
def test_a_kill_while_metrics_are_appended_and_then_rewritten(
  tmp_path, compilation_cache, reference
):
  workdir = str(tmp_path / 'run')
  # Writes: the (empty) file, then the records of step 10, dense accuracy at 10,
  # step 20 (train, test; then the checkpoint), step 30: that 6th write is cut.
  _kill(workdir, 'kill-write:metrics.jsonl:6', compilation_cache)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'rb') as f:
    torn = f.read()
  assert torn.count(b'\n') == 4 and not torn.endswith(b'\n')
  # The resumed run rewrites the file without the records after its checkpoint
  # (step 20); killed half-way through that rewrite, the file is as it was.
  _kill(workdir, 'kill-write:metrics.jsonl:1', compilation_cache)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'rb') as f:
    assert f.read() == torn
  _resume(workdir, reference)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['config.json', 'report.txt'])
def test_a_kill_while_a_file_is_replaced_keeps_the_old_one(
  tmp_path, compilation_cache, reference, name
):
  workdir = str(tmp_path / 'run')
  loop.train(train_faults.tiny_config(40), workdir)
  before = _read(os.path.join(workdir, name))
  # Extending the run to 60 steps rewrites config.json before training and
  # report.txt after it: each is killed half-way through its write.
  _kill(workdir, f'kill-write:{name}:1', compilation_cache)
  assert _read(os.path.join(workdir, name)) == before
  if name == 'config.json':
    assert json.loads(before)['num_steps'] == 40
  _resume(workdir, reference)


def _train_recording_warnings(config, workdir):
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter('always')
    result = loop.train(config, workdir)
  return result, [str(w.message) for w in warned]


@pytest.mark.slow
@pytest.mark.parametrize(
  'name, at',
  [
    ('metrics.jsonl', 6),  # an append after the checkpoint of step 20: the line is cut short
    ('config.json', 1),  # replaced atomically before training
    ('report.txt', 1),  # replaced atomically after training
  ],
)
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


@pytest.mark.slow
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
  assert cut == (
    f'{path}: line {len(lines) + 1} is cut short by an interrupted write; dropped '
    'it: b\'{"step": 40, "lo\''
  )
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


def _files(directory):
  return sorted(
    os.path.relpath(os.path.join(root, f), directory)
    for root, _, names in os.walk(directory)
    for f in names
  )


def _data_file(checkpoint):
  """The file of a checkpoint that holds its arrays' values: the largest OCDBT data file."""
  return max(
    (name for name in _files(checkpoint) if name.startswith('state/ocdbt.process_0/d/')),
    key=lambda name: os.path.getsize(os.path.join(checkpoint, name)),
  )


@pytest.mark.slow
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_every_file_of_the_newest_checkpoint_flipped_or_cut(tmp_path):
  """A flipped byte or a cut file anywhere in a checkpoint is caught, or changes nothing."""
  base = str(tmp_path / 'base')
  state = loop.train(train_faults.tiny_config(40), base).state
  reader = checkpoints.Checkpointer(base)
  good = {step: _arrays(reader.restore(step, state)[0]) for step in (20, 40)}
  reader.close()
  newest = os.path.join(base, 'checkpoints', '40')
  caught = set()
  for name in _files(newest):
    for mode in ('flip', 'cut'):
      workdir = str(tmp_path / 'case')
      shutil.rmtree(workdir, ignore_errors=True)
      shutil.copytree(base, workdir)
      _damage(os.path.join(workdir, 'checkpoints', '40', name), mode)
      reader = checkpoints.Checkpointer(workdir)
      with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter('always')
        step, restored, _ = reader.restore_newest(state, lambda meta: None)
      reader.close()
      # Whatever is restored is exactly what was saved.
      assert _arrays(restored).keys() == good[step].keys()
      for key, value in _arrays(restored).items():
        np.testing.assert_array_equal(value, good[step][key], err_msg=f'{name} {mode} {key}')
      if step == 20:
        caught.add((name, mode))
        # Other warnings (a garbage-collected file handle, a library's notice) may
        # come and go; exactly one names the damage.
        [message] = [str(w.message) for w in warned if 'is damaged' in str(w.message)]
        assert message.startswith(f'the checkpoint {workdir}/checkpoints/40 is damaged: ')
        assert message.endswith(
          f'moved it to {workdir}/damaged_checkpoints/40 and resumed from '
          'the checkpoint of step 20.'
        )
  data = _data_file(newest)
  assert {(data, 'flip'), (data, 'cut')} <= caught, sorted(caught)


@pytest.mark.slow
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_a_flipped_byte_in_the_newest_checkpoint_resumes_from_the_previous(tmp_path, reference):
  workdir = str(tmp_path / 'run')
  loop.train(train_faults.tiny_config(40), workdir)
  newest = os.path.join(workdir, 'checkpoints', '40')
  _damage(os.path.join(newest, _data_file(newest)), 'flip')
  result, messages = _train_recording_warnings(train_faults.tiny_config(), workdir)
  assert [m for m in messages if 'is damaged' in m] == [
    m
    for m in messages
    if m.startswith(f'the checkpoint {newest} is damaged: ')
    and m.endswith('and resumed from the checkpoint of step 20.')
  ]
  assert len([m for m in messages if 'is damaged' in m]) == 1
  _assert_same_run(workdir, _arrays(result.state), reference)


@pytest.mark.slow
def test_ctrl_c_during_the_checkpoint_where_pruning_begins_keeps_the_dense_accuracy(
  tmp_path, reference, monkeypatch
):
  # The dense accuracy is measured at begin_pruning_step (10), just before that
  # step's checkpoint; Ctrl-C inside that save makes the job save step 9.
  workdir = str(tmp_path / 'run')
  config = train_faults.tiny_config()
  config.checkpoint_every = 10
  real_save = checkpoints.Checkpointer.save

  def interrupted_save(self, step, state, meta):
    if step == 10:
      raise KeyboardInterrupt
    real_save(self, step, state, meta)

  monkeypatch.setattr(checkpoints.Checkpointer, 'save', interrupted_save)
  with pytest.raises(KeyboardInterrupt):
    loop.train(config, workdir)
  monkeypatch.setattr(checkpoints.Checkpointer, 'save', real_save)
  assert _committed(workdir) == ['9']
  result = loop.train(train_faults.tiny_config(), workdir)
  [dense] = [r for r in read_metrics(workdir) if 'dense_test_accuracy' in r]
  assert dense['step'] == 10
  _assert_same_run(workdir, _arrays(result.state), reference)


@pytest.mark.slow
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_a_cut_array_file_is_named_in_one_short_line(tmp_path):
  workdir = str(tmp_path / 'run')
  state = loop.train(train_faults.tiny_config(40), workdir).state
  newest = os.path.join(workdir, 'checkpoints', '40')
  _damage(os.path.join(newest, _data_file(newest)), 'cut')
  reader = checkpoints.Checkpointer(workdir)
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter('always')
    step, _, _ = reader.restore_newest(state, lambda meta: None)
  reader.close()
  assert step == 20
  [message] = [str(w.message) for w in warned if 'is damaged' in str(w.message)]
  # Tensorstore's root error names the array and the file; its spec repr is left out.
  assert message.startswith(
    f'the checkpoint {newest} is damaged: its state cannot be read: '
    'ValueError: OUT_OF_RANGE: Error reading "'
  ), message
  assert 'in OCDBT database at local file "state/": Requested byte range' in message
  assert message.endswith(
    f'moved it to {workdir}/damaged_checkpoints/40 and resumed from the checkpoint of step 20.'
  )
  assert 'TensorStore' not in message
  assert len(message.replace(workdir, 'W')) < 400


class _SigintInFinalizer:
  """An object whose finalizer receives Ctrl-C: Python cannot raise out of a finalizer."""

  def __del__(self):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs here, inside __del__
      pass


@pytest.fixture
def default_sigint():
  """Ctrl-C as in a terminal (a pytest worker may run with another handler)."""
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, before)


@pytest.mark.slow
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('where', ['in the save', 'in a finalizer'])
def test_ctrl_c_during_a_checkpoint_stops_after_it_and_is_never_lost(
  tmp_path, reference, monkeypatch, default_sigint, where
):
  workdir = str(tmp_path / 'run')
  real_save = checkpoints.Checkpointer.save

  def save_with_ctrl_c(self, step, state, meta):
    if step == 20:
      if where == 'in the save':
        os.kill(os.getpid(), signal.SIGINT)
      else:
        _SigintInFinalizer()  # collected at once
    real_save(self, step, state, meta)

  monkeypatch.setattr(checkpoints.Checkpointer, 'save', save_with_ctrl_c)
  with pytest.raises(KeyboardInterrupt):
    loop.train(train_faults.tiny_config(), workdir)
  monkeypatch.setattr(checkpoints.Checkpointer, 'save', real_save)
  # The save finished, and the run stopped right after it.
  assert _committed(workdir) == ['20']
  assert max(r['step'] for r in read_metrics(workdir)) == 20
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  _resume(workdir, reference)


def test_a_full_disk_for_the_event_file_is_one_error_not_a_second_one_on_close(
  tmp_path, monkeypatch
):
  from jaxprune_train import _metrics as metrics

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'events.out.tfevents')

  # The disk fills up at the third record; closing the file then fails too.
  writes = {'n': 0}
  real_write = metrics._EventFile.write

  def write(self, step, scalars):
    writes['n'] += 1
    if writes['n'] == 3:
      full()
    real_write(self, step, scalars)

  monkeypatch.setattr(metrics._EventFile, 'write', write)
  monkeypatch.setattr(metrics._EventFile, 'close', full)
  config = train_faults.tiny_config()
  config.tensorboard = True
  workdir = str(tmp_path / 'run')
  with pytest.raises(StorageError) as err:
    loop.train(config, workdir)
  assert str(err.value) == (
    f'cannot write the metrics to {workdir}/metrics.jsonl: No space left on device '
    '[errno 28]; no checkpoint was written yet; free some space, then run the same command '
    'to resume.'
  )


def _can_mount_tmpfs():
  probe = subprocess.run(
    ['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs -o size=4k tmpfs /mnt'], capture_output=True
  )
  return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
  shutil.which('unshare') is None or not _can_mount_tmpfs(),
  reason='needs a private tmpfs (unshare -rm, mount)',
)
def test_a_truly_full_disk_is_one_line_and_the_run_resumes_once_there_is_space(tmp_path):
  """A 200 kB tmpfs fills up in the first checkpoint, with TensorBoard and plots on (closing
  the event file failed again: 196 lines); grown to 4 MB, the same command finishes the run."""
  size_kb = 200
  disk = tmp_path / 'disk'
  disk.mkdir()
  command = [
    os.path.join(os.path.dirname(sys.executable), 'jaxprune-train'),
    f'--workdir={disk}/run',
    '--config.num_steps=60',
    '--config.checkpoint_every=30',
    '--config.progress_bar=False',
    '--config.model.features=(32, 16)',
    '--config.pruning.begin_pruning_step=10',
    '--config.pruning.sparsity_function_begin_step=10',
    '--config.pruning.end_pruning_step=40',
    '--config.pruning.sparsity_function_end_step=40',
    '--config.pruning.pruning_frequency=10',
  ]
  run = ' '.join(f"'{arg}'" for arg in command)
  script = (
    f'mount -t tmpfs -o size={size_kb}k tmpfs {disk} && cd {tmp_path} && '
    f'{run} >/dev/null 2>first.err; echo "first $?"; '
    f'mount -o remount,size=4m {disk} && {run} >/dev/null 2>second.err; echo "second $?"'
  )
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE='false')
  result = subprocess.run(
    ['unshare', '-rm', 'sh', '-c', script], capture_output=True, text=True, timeout=600, env=env
  )
  assert result.stdout.split() == ['first', '1', 'second', '0'], (
    result.stdout,
    (tmp_path / 'first.err').read_text(),
    (tmp_path / 'second.err').read_text(),
  )
  first = (tmp_path / 'first.err').read_text().splitlines()
  assert len(first) == 1, first
  assert first[0].startswith('jaxprune-train: cannot write the ')
  assert 'No space left on device [errno 28]' in first[0]
  assert (tmp_path / 'second.err').read_text() == ''
