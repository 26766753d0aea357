"""Tests for jaxprune_train._workdir and .files: config.json, the lock, atomic writes."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import ml_collections
import pytest
import train_faults

from jaxprune_train import (
  ConfigError,
  IncompatibleWorkdirError,
  StorageError,
  WorkdirBusyError,
)
from jaxprune_train import _files as files
from jaxprune_train import _workdir as workdir


def _config(**changes):
  config = ml_collections.ConfigDict(
    {
      'name': 'run',
      'num_steps': 100,
      'eval_every': 10,
      'seed': 0,
      'pruning': {'target_sparsity': 0.9, 'weight_sparsity_map': ('',)},
    }
  )
  for key, value in changes.items():
    node = config
    *parents, leaf = key.split('.')
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def _recorded(path):
  with open(os.path.join(path, 'config.json')) as f:
    return json.load(f)


def test_config_differences_flattens_and_ignores_resumable_fields():
  saved = workdir.config_to_json(_config())
  current = workdir.config_to_json(_config(**{'num_steps': 500, 'pruning.target_sparsity': 0.95}))
  assert workdir.config_differences(saved, current) == [('pruning.target_sparsity', 0.9, 0.95)]
  current['extra'] = 1
  assert workdir.config_differences(saved, current)[0] == ('extra', '<absent>', 1)


def test_config_is_recorded_then_checked_in_one_line(tmp_path):
  path = str(tmp_path)
  workdir.record_config(path, _config())
  assert _recorded(path)['pruning']['weight_sparsity_map'] == ['']
  workdir.check_config(path, _config())  # same config: fine
  workdir.check_config(path, _config(num_steps=300))  # longer run: fine
  with pytest.raises(IncompatibleWorkdirError) as err:
    workdir.check_config(
      path, _config(**{'seed': 1, 'pruning.weight_sparsity_map': ('Dense_0:0.5',)})
    )
  assert str(err.value) == (
    f'--workdir={path!r} holds a run with a different config, so it cannot be resumed '
    "(config.pruning.weight_sparsity_map: [''] in the saved run, ['Dense_0:0.5'] now; "
    'config.seed: 0 in the saved run, 1 now). Pick a new --workdir (or restore the old '
    'values) instead of overwriting that run.'
  )
  assert _recorded(path)['seed'] == 0


def test_an_unreadable_config_json_is_reported_and_skipped(tmp_path):
  (tmp_path / 'config.json').write_text('{"seed": 0, "na')  # cut short outside the job
  with pytest.warns(
    UserWarning,
    match='config.json is unreadable .*; checking the run against '
    'the config stored in its newest checkpoint instead',
  ):
    assert workdir.read_config(str(tmp_path)) is None
  (tmp_path / 'config.json').write_text('[1, 2]')
  with pytest.warns(UserWarning, match='expected a JSON object, found list'):
    workdir.check_config(str(tmp_path), _config())


def test_atomic_write_keeps_the_old_file_when_the_disk_fills_half_way(tmp_path):
  path = str(tmp_path / 'config.json')
  files.atomic_write(path, '{"seed": 0}\n')
  with train_faults.fail_writes('config.json') as writes, pytest.raises(OSError) as err:
    files.atomic_write(path, '{"seed": 1, "a long record": "' + 'x' * 100 + '"}\n')
  assert writes == [1] and err.value.errno == errno.ENOSPC
  with open(path) as f:
    assert f.read() == '{"seed": 0}\n'
  assert os.listdir(tmp_path) == ['config.json']  # no temporary file left behind
  files.atomic_write(path, b'bytes too')
  with open(path, 'rb') as f:
    assert f.read() == b'bytes too'


def test_record_config_survives_a_full_disk(tmp_path):
  workdir.record_config(str(tmp_path), _config())
  with train_faults.fail_writes('config.json'), pytest.raises(OSError):
    workdir.record_config(str(tmp_path), _config(num_steps=500))
  assert _recorded(str(tmp_path))['num_steps'] == 100


@pytest.mark.parametrize(
  'error, code',
  [
    (OSError(errno.ENOSPC, 'No space left on device'), errno.ENOSPC),
    (OSError(errno.EDQUOT, 'Disk quota exceeded'), errno.EDQUOT),
    (
      ValueError(
        'OUT_OF_RANGE: Error writing "params.k/0.0" in OCDBT database: Failed to write '
        "54186 bytes to file 7: File too large [os_error_code='27']"
      ),
      errno.EFBIG,
    ),
    (OSError(errno.ENOENT, 'No such file'), None),
    (ValueError('a bug'), None),
  ],
)
def test_storage_errors_are_told_from_bugs(error, code):
  assert files.storage_errno(error) == code


def test_writing_turns_storage_errors_into_one_line(tmp_path):
  with (
    pytest.raises(StorageError) as err,
    files.writing('the report', 'runs/x/report.txt', 'free some space'),
  ):
    raise OSError(errno.ENOSPC, 'No space left on device')
  assert str(err.value) == (
    'cannot write the report to runs/x/report.txt: No space left on '
    'device [errno 28]; free some space.'
  )
  with pytest.raises(KeyError), files.writing('the report', 'r', 'x'):
    raise KeyError('a bug keeps its traceback')


def test_a_second_run_in_a_locked_workdir_is_refused(tmp_path):
  path = str(tmp_path / 'run')
  with files.locked(path):
    with pytest.raises(WorkdirBusyError) as err, files.locked(path):
      pass
    assert str(err.value) == (
      f'--workdir={path!r} is in use by another jaxprune-train run (pid {os.getpid()}); '
      'wait for it to end, or give this run another --workdir.'
    )
  with files.locked(path):  # released when the first run ended
    pass


def test_the_lock_goes_with_a_killed_process(tmp_path):
  path = str(tmp_path / 'run')
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      textwrap.dedent(f"""
          import sys, time
          from jaxprune_train import _files as files
          with files.locked({path!r}):
            print('locked', flush=True)
            time.sleep(60)
          """),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline() == 'locked\n'
    with pytest.raises(WorkdirBusyError, match=f'pid {holder.pid}'), files.locked(path):
      pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with files.locked(path):
    pass


def test_a_workdir_that_cannot_be_made_is_a_config_error(tmp_path):
  (tmp_path / 'file').write_text('')
  path = str(tmp_path / 'file' / 'run')
  with pytest.raises(ConfigError) as err, files.locked(path):
    pass
  assert str(err.value).startswith(f'--workdir={path!r} cannot be used (Not a directory: ')
  assert str(err.value).endswith('pick a directory you can write to.')


def test_a_run_saved_before_a_field_existed_resumes_at_its_default(tmp_path):
  """config.channels came after runs were saved: absent there and at its default
  (disabled) now, it is no difference; set to anything else, it is one."""
  from jaxprune_train import _defaults as defaults

  path = str(tmp_path)
  old = workdir.config_to_json(defaults.get_config())
  del old['channels']
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(old, f)
  workdir.check_config(path, defaults.get_config())
  changed = defaults.get_config()
  changed.channels.enabled = True
  with pytest.raises(IncompatibleWorkdirError, match=r"config\.channels\.enabled: '<absent>'"):
    workdir.check_config(path, changed)
