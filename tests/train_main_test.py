"""Tests of the `jaxprune-train` command line (run as subprocesses)."""

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time

import pytest

import jaxprune

# The runs compile the same steps: one persistent cache for all of them (tests/conftest.py).

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), 'jaxprune-train')
# A short schedule: dense until step 20, pruned to the target by step 100.
SHORT = [
  '--config.num_steps=120',
  '--config.eval_every=60',
  '--config.checkpoint_every=60',
  '--config.progress_bar=False',
  '--config.pruning.begin_pruning_step=20',
  '--config.pruning.sparsity_function_begin_step=20',
  '--config.pruning.end_pruning_step=100',
  '--config.pruning.sparsity_function_end_step=100',
  '--config.pruning.pruning_frequency=10',
]


def _short(num_steps):
  """SHORT with another `num_steps` (each flag is given once: twice is an error)."""
  return [f'--config.num_steps={num_steps}', *SHORT[1:]]


def _run(args, cwd=REPO):
  return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def _report_rows(workdir):
  with open(os.path.join(workdir, 'report.txt')) as f:
    rows = [line.split() for line in f if line.startswith('Dense_')]
  return {row[0]: int(row[3].replace(',', '')) for row in rows}


def _config_json(workdir):
  with open(os.path.join(workdir, 'config.json')) as f:
    return json.load(f)


@pytest.mark.slow
def test_config_file_and_field_overrides(tmp_path):
  workdir = str(tmp_path / 'digits')
  result = _run(
    [
      SCRIPT,
      '--config',
      'configs/digits_mlp.py',
      '--workdir',
      workdir,
      *SHORT,
      '--config.pruning.target_sparsity=0.95',
      "--config.pruning.weight_sparsity_map=['Dense_0/kernel:0.5']",
    ]
  )
  assert result.returncode == 0, result.stderr
  pruning = _config_json(workdir)['pruning']
  assert pruning['target_sparsity'] == 0.95
  assert pruning['weight_sparsity_map'] == ['Dense_0/kernel:0.5']
  # The default's exact threshold keeps round(N * (1 - s)) weights:
  # 19,200 * 0.5, 30,000 * 0.05 and 1,000 * 0.05.
  assert _report_rows(workdir) == {
    'Dense_0/kernel': 9600,
    'Dense_1/kernel': 1500,
    'Dense_2/kernel': 50,
  }
  assert f'Outputs in {workdir}' in result.stdout
  assert 'test accuracy: dense at start of pruning (step 20)' in result.stdout
  # The same workdir with another seed is refused, naming the field.
  result = _run([SCRIPT, '--workdir', workdir, *SHORT, '--config.seed=3'])
  assert result.returncode == 1
  assert 'config.seed: 0 in the saved run, 3 now' in result.stderr
  assert 'Pick a new --workdir' in result.stderr


@pytest.mark.slow
def test_tf_hparams_string_goes_on_top_of_the_config(tmp_path):
  workdir = str(tmp_path / 'tf')
  result = _run(
    [
      sys.executable,
      '-m',
      'jaxprune_train',
      '--workdir',
      workdir,
      *SHORT,
      '--config.pruning.target_sparsity=0.5',
      '--pruning_hparams=target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]',
    ]
  )
  assert result.returncode == 0, result.stderr
  pruning = _config_json(workdir)['pruning']
  assert pruning['target_sparsity'] == 0.9
  assert pruning['weight_sparsity_map'] == ['Dense_1:0.95']
  assert _report_rows(workdir) == {
    'Dense_0/kernel': 1920,
    'Dense_1/kernel': 1500,
    'Dense_2/kernel': 100,
  }


@pytest.mark.slow
def test_nm_on_the_command_line_takes_the_place_of_the_configs_target(tmp_path):
  # The default config's target_sparsity (0.9) is not the user's: N:M alone is accepted.
  workdir = str(tmp_path / 'nm')
  result = _run([SCRIPT, '--workdir', workdir, *SHORT, '--config.pruning.nm_sparsity=2:4'])
  assert result.returncode == 0, result.stderr
  assert _config_json(workdir)['pruning']['nm_sparsity'] == '2:4'
  # 2 of every 4 weights of each kernel: 64x300, 300x100 and 100x10.
  assert _report_rows(workdir) == {
    'Dense_0/kernel': 9600,
    'Dense_1/kernel': 15000,
    'Dense_2/kernel': 500,
  }
  with open(os.path.join(workdir, 'report.txt')) as f:
    rows = [line.split() for line in f if line.startswith('Dense_')]
  assert [(row[4], row[-1]) for row in rows] == [('0.500', '2:4')] * 3


@pytest.mark.slow
def test_help_lists_every_config_field_and_exits_0():
  result = _run([SCRIPT, '--help'])
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  for flag in ('  --config: ', '  --workdir: ', '  --pruning_hparams: '):
    assert any(line.startswith(flag) for line in lines), flag
  assert 'Config fields, with the values of the defaults:' in lines
  fields = {
    line.split()[0]: line.split(None, 1)[1:] for line in lines if line.startswith('  --config.')
  }
  assert fields['--config.num_steps=3000'] == [
    'training steps in all; rerun with a larger value to extend a run'
  ]
  assert fields["--config.optimizer.name='adam'"] == ["'adam', 'adamw' or 'sgd'"]
  # Every pruning hparam, with the default config's value and its meaning.
  assert fields['--config.pruning.target_sparsity=0.9'] == [
    'sparsity at and after sparsity_function_end_step, in [0, 1)'
  ]
  assert fields["--config.pruning.threshold_method='exact'"] == [
    "'histogram' (TF's binned CDF) or 'exact' (the k-th magnitude)"
  ]
  # An empty map, as the flag that sets it (the hparams store it as ('',)).
  assert fields['--config.pruning.weight_sparsity_map="[]"'] == [
    'per-leaf targets, e.g. "[\'Dense_0/kernel:0.5\']"'
  ]
  pruning = [f for f in fields if f.startswith('--config.pruning.')]
  assert len(pruning) == len(jaxprune.get_pruning_hparams())
  assert all(fields[f] for f in pruning)
  # With --config, that file's values.
  result = _run([SCRIPT, '--config', 'configs/digits_cnn.py', '-h'])
  assert result.returncode == 0
  assert 'Config fields, with the values of configs/digits_cnn.py:' in result.stdout
  assert "  --config.model.name='cnn' " in result.stdout


def _one_line_error(args, cwd=REPO):
  result = _run([SCRIPT, *args], cwd=cwd)
  assert result.returncode == 1, (result.stdout, result.stderr)
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


@pytest.mark.slow
def test_bad_values_are_clear_errors(tmp_path):
  workdir = f'--workdir={tmp_path / "bad"}'
  assert _one_line_error([workdir, '--config.pruning.target_sparsity=1.5']) == (
    'jaxprune-train: target_sparsity=1.5: must be in [0, 1).'
  )
  assert _one_line_error(
    [workdir, '--pruning_hparams=target_sparsity=0.9,no_such_field=1']
  ).startswith("jaxprune-train: parse_hparams: unknown hyperparameter 'no_such_field'")
  assert not os.path.exists(tmp_path / 'bad')


@pytest.mark.slow
@pytest.mark.parametrize(
  'args, message',
  [
    (
      ['--config', 'nope.py'],
      f'--config=nope.py: no such file (relative to {REPO}); give a config file such as '
      'configs/digits_cnn.py, or leave --config out for the default',
    ),
    (['--config='], '--config is empty; give a config file such as configs/digits_cnn.py'),
    (
      ['--config.prune=False', '--config.pruning.target_sparsity=0.5'],
      '--config.pruning.target_sparsity=0.5 has no effect: config.prune=False trains the dense '
      'model only; drop the pruning flags, or set --config.prune=True.',
    ),
    (
      ['--config.prune=False', '--config.channels.enabled=True'],
      'config.channels.enabled=True prunes whole channels, but config.prune=False trains the '
      'dense model only; set one of them the other way.',
    ),
    (
      ['--config.num_step=5'],
      "--config.num_step=5: the config has no field 'num_step'; did you mean 'num_steps'?",
    ),
    (
      ['--config', 'configs/digits_cnn.py', '--config.pruning.target_sparisty=0.5'],
      "--config.pruning.target_sparisty=0.5: config.pruning has no field 'target_sparisty'; did "
      "you mean 'target_sparsity'?",
    ),
    (
      ['--config.num_steps=abc'],
      "--config.num_steps=abc: invalid literal for int() with base 10: 'abc'; the field takes an "
      'integer, e.g. 3000',
    ),
    (['--workdirr=x'], "Unknown command line flag 'workdirr'. Did you mean: workdir ?"),
    (
      ['stray'],
      "unexpected arguments ['stray']; flags take the form --name=value "
      '(jaxprune-train --help lists them).',
    ),
    (
      ['--config.max_checkpoints_to_keep=0'],
      'config.max_checkpoints_to_keep=0: must be an integer >= 1, or no checkpoint is kept to '
      'resume from (the default is 2).',
    ),
    (
      ['--config.optimizer.learning_rate=nan'],
      'config.optimizer.learning_rate=nan: must be a finite number > 0 (the default is 0.001).',
    ),
    (
      ['--config.num_steps=3000000000'],
      'config.num_steps=3000000000: must be an integer in [1, 2147483647] (the default is 3000).',
    ),
    (
      ['--config.batch_size=2000'],
      'batch_size=2000: must be between 1 and the number of training examples (1348).',
    ),
    (
      ['--config.mesh_shape=(2,4)'],
      'mesh_shape=(2, 4) uses 8 devices but 1 are available; make the product of the sizes equal '
      'the device count, or use () for one device.',
    ),
    (
      ['--config.data.name=npz', '--config.data.path=README.md'],
      "data.path='README.md' is not a .npz file (a .npz file is a zip archive); pass the path of a "
      '.npz file with arrays x_train, y_train, x_test, y_test, e.g. written by numpy.savez.',
    ),
    (
      ['--config.model.features=(32,16)', '--config.model.features=(8,)'],
      "--config.model.features is given twice: '(32,16)', then '(8,)'; give each flag once "
      '(of two values, one would be dropped or both mixed without a word).',
    ),
    (
      ['--config.optimizer.learning_rate=0.1', '--config.optimizer.learning_rate', '0.01'],
      "--config.optimizer.learning_rate is given twice: '0.1', then '0.01'; give each flag "
      'once (of two values, one would be dropped or both mixed without a word).',
    ),
    (
      ['--config.mesh_shape=(2,2)', '--config.mesh_shape=(4,1)'],
      "--config.mesh_shape is given twice: '(2,2)', then '(4,1)'; give each flag once (of "
      'two values, one would be dropped or both mixed without a word).',
    ),
    (
      ['--coordinator_address=garbage', '--num_processes=2', '--process_id=1'],
      "--coordinator_address='garbage': must be host:port: the address of process 0 and a "
      'free port, e.g. 10.0.0.1:1234 or [::1]:1234.',
    ),
    (
      ['--coordinator_address=127.0.0.1:99999', '--num_processes=2', '--process_id=1'],
      "--coordinator_address='127.0.0.1:99999': the port '99999' must be a number from 1 to "
      '65535: the address of process 0 and a free port, e.g. 10.0.0.1:1234 or [::1]:1234.',
    ),
    (
      ['--config.pruning.target_sparsity=0.8', '--config.pruning.nm_sparsity=2:4'],
      "nm_sparsity='2:4' keeps 2 of every 4 weights of each pruned leaf (50% sparse), so "
      'target_sparsity=0.8 would be dropped: give a target or nm_sparsity, not both '
      '(nm_sparsity_map=[regex:2:4] puts N:M on some leaves and leaves the target to the '
      'others).',
    ),
    (
      # A target on the command line at the field's default's value is a target all the same.
      ['--config.pruning.target_sparsity=0.5', '--config.pruning.nm_sparsity=2:4'],
      "nm_sparsity='2:4' keeps 2 of every 4 weights of each pruned leaf (50% sparse), so "
      'target_sparsity=0.5 would be dropped: give a target or nm_sparsity, not both '
      '(nm_sparsity_map=[regex:2:4] puts N:M on some leaves and leaves the target to the '
      'others).',
    ),
    (
      ['--pruning_hparams=target_sparsity=0.5,nm_sparsity=2:4'],
      "nm_sparsity='2:4' keeps 2 of every 4 weights of each pruned leaf (50% sparse), so "
      'target_sparsity=0.5 would be dropped: give a target or nm_sparsity, not both '
      '(nm_sparsity_map=[regex:2:4] puts N:M on some leaves and leaves the target to the '
      'others).',
    ),
    (
      ['--config.pruning.nm_sparsity=1:4', '--pruning_hparams=target_sparsity=0.9'],
      "nm_sparsity='1:4' keeps 1 of every 4 weights of each pruned leaf (75% sparse), so "
      'target_sparsity=0.9 would be dropped: give a target or nm_sparsity, not both '
      '(nm_sparsity_map=[regex:1:4] puts N:M on some leaves and leaves the target to the '
      'others).',
    ),
    (
      ['--config.data.name=npz', '--config.data.path=absent.npz'],
      "data.path='absent.npz': no such file; pass the path of a .npz file with arrays x_train, "
      'y_train, x_test, y_test, e.g. written by numpy.savez.',
    ),
  ],
)
def test_each_user_error_is_one_line_without_a_traceback(tmp_path, args, message):
  workdir = str(tmp_path / 'run')
  assert _one_line_error([*args, f'--workdir={workdir}']) == f'jaxprune-train: {message}'
  assert not os.path.exists(workdir)  # refused before anything was written


@pytest.mark.slow
def test_an_empty_workdir_is_an_error(tmp_path):
  """`--workdir=` trained into runs/digits_mlp under the current directory."""
  result = _run([SCRIPT, '--workdir='], cwd=tmp_path)
  assert result.returncode == 1
  assert result.stderr.splitlines() == [
    'jaxprune-train: --workdir is empty; give the directory of the run (e.g. '
    '--workdir=runs/mine), or leave the flag out for runs/<config.name>.'
  ]
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_config_files_that_do_not_load_and_unusable_workdirs(tmp_path):
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config():\n  return {"a": 1\n')
  assert _one_line_error(['--config', str(broken)]) == (
    f"jaxprune-train: --config={broken}: loading it failed ('{{' was never closed at line 2); "
    'a config file defines get_config() returning an ml_collections.ConfigDict'
  )
  raising = tmp_path / 'raising.py'
  raising.write_text('def get_config():\n  raise KeyError("no such preset")\n')
  assert _one_line_error(['--config', str(raising)]) == (
    f"jaxprune-train: --config={raising}: loading it failed (KeyError: 'no such preset'); "
    'a config file defines get_config() returning an ml_collections.ConfigDict'
  )
  (tmp_path / 'file').write_text('')
  workdir = tmp_path / 'file' / 'run'
  assert _one_line_error([f'--workdir={workdir}', '--config.num_steps=10']) == (
    f"jaxprune-train: --workdir='{workdir}' cannot be used (Not a directory: "
    f"'{workdir}'); pick a directory you can write to."
  )


@pytest.mark.slow
def test_a_finished_run_rerun_shorter_keeps_its_config(tmp_path):
  workdir = str(tmp_path / 'run')
  assert _run([SCRIPT, '--workdir', workdir, *SHORT]).returncode == 0
  result = _run([SCRIPT, '--workdir', workdir, *_short(60)])
  assert result.returncode == 0, result.stderr
  assert f'The run in {workdir} is complete (step 120); reporting it.' in result.stdout
  assert _config_json(workdir)['num_steps'] == 120


@pytest.mark.slow
def test_a_refused_run_writes_no_config(tmp_path):
  workdir = str(tmp_path / 'run')
  assert _run([SCRIPT, '--workdir', workdir, *SHORT]).returncode == 0
  os.remove(os.path.join(workdir, 'config.json'))  # only the checkpoints know the config now
  message = _one_line_error(['--workdir', workdir, *SHORT, '--config.seed=3'])
  assert 'config.seed: 0 in the saved run, 3 now' in message
  assert not os.path.exists(os.path.join(workdir, 'config.json'))
  # So the original command still resumes the run.
  result = _run([SCRIPT, '--workdir', workdir, *_short(130)])
  assert result.returncode == 0, result.stderr
  assert _config_json(workdir)['num_steps'] == 130 and _config_json(workdir)['seed'] == 0


@pytest.mark.slow
def test_a_second_run_in_the_same_workdir_is_refused(tmp_path):
  workdir = str(tmp_path / 'run')
  first = subprocess.Popen(
    [SCRIPT, '--workdir', workdir, *_short(1000000)],
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    metrics = os.path.join(workdir, 'metrics.jsonl')
    for _ in range(600):  # the first run is training once it has written a record
      if os.path.exists(metrics) and os.path.getsize(metrics):
        break
      assert first.poll() is None, first.stderr.read()
      time.sleep(0.1)
    message = _one_line_error(['--workdir', workdir, *SHORT])
    assert message == (
      f'jaxprune-train: --workdir={workdir!r} is in use by another '
      f'jaxprune-train run (pid {first.pid}); wait for it to end, or give this '
      'run another --workdir.'
    )
  finally:
    first.kill()
    first.wait()
  assert _config_json(workdir)['num_steps'] == 1000000  # the second run wrote nothing


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_run_resumes(tmp_path):
  workdir = str(tmp_path / 'run')

  def small_files():
    # No file may grow past 100 kB: the first checkpoint's array file (params
    # and Adam's moments, ~0.6 MB) cannot be written, as on a full disk.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

  # Without the shared compilation cache: a cache entry cut short by the file
  # size limit would be read (and warned about) by the other tests' runs.
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE='false')
  result = subprocess.run(
    [SCRIPT, '--workdir', workdir, *SHORT],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    preexec_fn=small_files,
    env=env,
  )
  assert result.returncode == 1
  assert result.stderr.splitlines() == [
    f'jaxprune-train: cannot write the checkpoint of step 60 to {workdir}/checkpoints: File '
    'too large [errno 27]; free some space, then run the same command.'
  ]
  result = _run([SCRIPT, '--workdir', workdir, *SHORT])
  assert result.returncode == 0, result.stderr
  assert _report_rows(workdir) == {
    'Dense_0/kernel': 1920,
    'Dense_1/kernel': 3000,
    'Dense_2/kernel': 100,
  }


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_line_and_saves_nothing_non_finite(tmp_path):
  workdir = str(tmp_path / 'run')
  message = _one_line_error(['--workdir', workdir, *SHORT, '--config.optimizer.learning_rate=1e30'])
  assert message.startswith('jaxprune-train: training diverged: at step 20 the training loss is ')
  assert message.endswith(
    '(all finite at step 0); config.optimizer.learning_rate=1e+30 is likely '
    'too high. Nothing non-finite was saved: no checkpoint was written. '
    'Train again with a lower learning rate and a new --workdir.'
  )
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == []
  assert not os.path.exists(os.path.join(workdir, 'report.txt'))


@pytest.mark.slow
def test_a_short_run_is_warned_about(tmp_path):
  result = _run([SCRIPT, '--workdir', str(tmp_path / 'run'), *_short(60)])
  assert result.returncode == 0, result.stderr
  # Updates at 20, 30, 40, 50: s(50) = 0.9 * (1 - (1 - 30 / 80) ** 3) = 0.6803.
  assert result.stderr.splitlines() == [
    'jaxprune-train: warning: config.num_steps=60 stops the mask updates at step 50, where the '
    'schedule is at 68.0% sparsity, short of target_sparsity=0.9 (reached at '
    'sparsity_function_end_step=100, by the update at step 100); set num_steps above 100, or '
    'end the schedule earlier.'
  ]


@pytest.mark.slow
def test_default_run_with_no_flags_meets_the_goal(tmp_path):
  """The README's first command: >= 90% sparsity, within 2 points of the dense model."""
  result = _run([SCRIPT], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr
  workdir = tmp_path / 'runs' / 'digits_mlp'
  assert _report_rows(str(workdir)) == {
    'Dense_0/kernel': 1920,
    'Dense_1/kernel': 3000,
    'Dense_2/kernel': 100,
  }
  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  [dense] = [r['dense_test_accuracy'] for r in records if 'dense_test_accuracy' in r]
  final = records[-1]['test_accuracy']
  assert records[-1]['step'] == 3000
  assert final >= dense - 0.02
  for name in ('sparsity.png', 'accuracy.png', 'layer_sparsity.png', 'report.txt'):
    assert (workdir / name).exists()
  assert 'Outputs in' in result.stdout and 'runs/digits_mlp' in result.stdout


def test_stderr_drops_only_the_closed_loop_tracebacks_of_a_failed_write():
  import io

  from jaxprune_train import _process as process

  out = io.StringIO()
  stderr = process.WithoutClosedLoopTracebacks(out)
  # As tensorstore's threads print it, piece by piece, once per aborted write.
  for piece in (
    'Traceback (most recent call last):\n',
    '  File "asyncio/base_events.py", line 806, in call_soon_threadsafe\n',
    '    self._check_closed()\n',
    'RuntimeError: Event loop is closed\n',
  ):
    stderr.write(piece)
  stderr.write('jaxprune-train: cannot write the checkpoint\n')
  bug = (
    'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
    "KeyError: 'a bug keeps its traceback'\n"
  )
  stderr.write(bug)
  assert out.getvalue() == 'jaxprune-train: cannot write the checkpoint\n' + bug


def test_warnings_are_one_line_each_and_abandoned_writes_are_not_shown(capsys, monkeypatch):
  import gc
  import warnings

  from jaxprune_train import _main as main

  # The job's hooks on the process, put back once the test is over.
  monkeypatch.setattr(sys, 'stderr', sys.stderr)
  monkeypatch.setattr(sys, 'unraisablehook', sys.unraisablehook)

  async def write_fragment():
    pass

  with warnings.catch_warnings():
    main._route_warnings()
    write_fragment()  # a write orbax abandoned: its coroutine is collected unawaited
    gc.collect()
    warnings.warn('a warning of the job\nover two lines', RuntimeWarning, stacklevel=1)
  assert capsys.readouterr().err == (
    'jaxprune-train: warning: a warning of the job; over two lines\n'
  )


def test_reads_abandoned_with_a_damaged_checkpoint_are_not_shown(monkeypatch):
  """When no checkpoint can be read, orbax's abandoned reads fail again as they are
  collected: 950 to 1,519 lines of 'Exception ignored in: <coroutine object
  _read_array_index_and_device_put>' after the job's one line. Other unraisable
  errors are still shown."""
  import gc

  from jaxprune_train import _main as main

  shown = []
  monkeypatch.setattr(sys, 'unraisablehook', lambda info: shown.append(info.object))
  monkeypatch.setattr(sys, 'stderr', sys.stderr)

  class Pending:
    def __await__(self):
      yield

  async def _read_array_index_and_device_put():
    try:
      await Pending()
    finally:
      raise RuntimeError('Event loop is closed')

  class Finalizer:
    def __del__(self):
      raise KeyError('a bug in a finalizer is shown')

  main._route_warnings()
  read = _read_array_index_and_device_put()
  read.send(None)  # started, then abandoned
  del read
  finalizer = Finalizer()
  del finalizer
  gc.collect()
  assert [getattr(x, '__qualname__', repr(x)).rsplit('.', 2)[-2:] for x in shown] == [
    ['Finalizer', '__del__']
  ], shown


@pytest.mark.slow
def test_each_warning_is_shown_once_in_one_line(tmp_path):
  """The hparams are validated once (no de-duplication in the job): a warning of the
  hparams string, one of the spec and one of the config each print one line, once."""
  result = _run(
    [
      SCRIPT,
      '--workdir',
      str(tmp_path / 'run'),
      *_short(30),
      '--pruning_hparams=end_pruning_step=60,weight_name_regex=weight$',
    ]
  )
  assert result.returncode == 0, result.stderr
  lines = result.stderr.splitlines()
  fields = [re.match(r'jaxprune-train: warning: (?:jaxprune: )?([\w.]+)=', line) for line in lines]
  assert [m and m.group(1) for m in fields] == [
    'end_pruning_step',
    'weight_name_regex',
    'config.num_steps',
  ], lines


@pytest.mark.slow
def test_without_tensorboardx_the_outputs_name_no_tensorboard_folder(tmp_path):
  hidden = tmp_path / 'hidden' / 'tensorboardX'
  hidden.mkdir(parents=True)
  (hidden / '__init__.py').write_text('raise ImportError("hidden by the test")\n')
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      filter(None, [str(tmp_path / 'hidden'), os.environ.get('PYTHONPATH')])
    ),
  )
  workdir = str(tmp_path / 'run')
  result = subprocess.run(
    [SCRIPT, '--workdir', workdir, *SHORT],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  assert result.returncode == 0, result.stderr
  assert result.stderr.splitlines() == [
    f'jaxprune-train: warning: tensorboardX is not installed; writing only {workdir}/'
    'metrics.jsonl. Install it with `pip install tensorboardX`.'
  ]
  assert result.stdout.splitlines()[-1] == (
    f'Outputs in {workdir}: report.txt, metrics.jsonl, checkpoints/, sparsity.png, '
    'accuracy.png, layer_sparsity.png'
  )
  assert not os.path.exists(os.path.join(workdir, 'tensorboard'))
