"""Multi-process jobs that cannot start end in one line per process and status 1 (never
JAX's abort), within 30 s of the start: processes given different sizes or the same id, a
missing process, a coordinator port in use, and processes given different settings."""

import signal
import socket
import subprocess
import sys
import time

import pytest
import train_multiprocess as mp

pytestmark = pytest.mark.slow

TIMEOUT = 120  # seconds: far above what these take (a hang would run into JAX's 300)
CONFIG_FILE = f"""
import sys
sys.path.insert(0, {mp.HERE!r})
from train_multiprocess import configs


def get_config():
  return configs()['mlp'](60)
"""


def _command(tmp_path, port, num_processes, process_id, *extra, workdir=None, timeout=30):
  # --initialization_timeout_seconds counts from each process's start: 30 s leaves a loaded
  # machine time to import JAX in both processes; the jobs that cannot join are given 5.
  return [
    sys.executable,
    '-m',
    'jaxprune_train',
    '--config',
    str(tmp_path / 'tiny.py'),
    f'--workdir={workdir or tmp_path / "run"}',
    f'--coordinator_address=127.0.0.1:{port}',
    f'--num_processes={num_processes}',
    f'--process_id={process_id}',
    f'--initialization_timeout_seconds={timeout}',
    *extra,
  ]


def _launch(tmp_path, name, commands):
  """(exit statuses, last stderr line of each process, seconds until all ended)."""
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  start = time.monotonic()
  with mp.processes(commands, 4, str(tmp_path), name) as started:
    codes = mp.wait_all(started, TIMEOUT)
  seconds = time.monotonic() - start
  errs = [mp.read(str(tmp_path), name, i) for i in range(len(commands))]
  # One line each: no raw runtime text (JAX's log lines, its fatal message, a stack trace).
  assert [len(err.strip().splitlines()) for err in errs] == [1] * len(commands), errs
  return codes, [err.strip() for err in errs], seconds


def test_processes_given_different_sizes_stop_with_one_line(tmp_path):
  port = mp.free_port()
  codes, lines, _ = _launch(
    tmp_path, 'sizes', [_command(tmp_path, port, 2, 0), _command(tmp_path, port, 3, 1)]
  )
  assert codes == [1, 1], lines
  for line in lines:
    assert line.startswith(
      'jaxprune-train: the processes were given different --num_processes ([2, 3], by process id'
    ), line


def test_a_job_of_one_and_a_process_of_a_job_of_two(tmp_path):
  """--num_processes=1 in process 0 (a job of its own) and 2 in process 1: JAX's service
  refuses process 1 (JAX aborted it with SIGABRT), or, where process 0 has already ended,
  process 1 finds no job to join within its timeout."""
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path,
    'one_two',
    [_command(tmp_path, port, 1, 0), _command(tmp_path, port, 2, 1, timeout=10)],
  )
  # Process 0, alone with 4 devices, refuses the config's 2x4 mesh.
  assert codes == [1, 1], lines
  joined = f'jaxprune-train: process 1 could not join the job at 127.0.0.1:{port}'
  assert lines[1].startswith(
    (f"{joined}: JAX's coordination service stopped it", f'{joined} within 10 s of its start')
  ), lines
  assert seconds < 30
  assert not (tmp_path / 'run').exists() or not any((tmp_path / 'run').glob('checkpoints/*'))


def test_two_processes_with_one_id_stop_with_one_line_each(tmp_path):
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path,
    'same',
    [_command(tmp_path, port, 2, 0, timeout=5), _command(tmp_path, port, 2, 0, timeout=5)],
  )
  assert codes == [1, 1], lines
  for line in lines:
    assert line.startswith('jaxprune-train: '), line
  # One finds process 0's port taken (or, when both looked before either listened, is
  # stopped by JAX's service); the other waits 10 s for process 1, then stops.
  for line in lines:
    assert 'cannot listen on port' in line or 'could not join the job' in line, lines
  assert seconds < 60


def test_a_coordinator_port_in_use_is_one_line(tmp_path):
  with socket.socket() as busy:
    busy.bind(('127.0.0.1', 0))
    busy.listen()
    port = busy.getsockname()[1]
    codes, lines, _ = _launch(tmp_path, 'port', [_command(tmp_path, port, 2, 0)])
  assert codes == [1]
  assert lines[0] == (
    f'jaxprune-train: --coordinator_address=127.0.0.1:{port}: process 0 '
    f'cannot listen on port {port} (Address already in use): another job (or '
    'an earlier run still ending) uses it; give every process another free '
    'port.'
  ), lines


def test_a_job_without_process_0_stops_within_its_timeout(tmp_path):
  """Both given --process_id=1: no process runs the coordination service, so each would
  wait for it forever."""
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path,
    'none',
    [_command(tmp_path, port, 2, 1, timeout=5), _command(tmp_path, port, 2, 1, timeout=5)],
  )
  assert codes == [1, 1], lines
  for line in lines:
    assert line.startswith(
      f'jaxprune-train: process 1 could not join the job at 127.0.0.1:{port} within 5 s of '
      'its start: a process is missing'
    ), line
  assert seconds < 30


def test_a_missing_process_is_one_line_within_the_timeout(tmp_path):
  """Process 1 never starts: process 0 ended after JAX's timeout by SIGABRT (exit -6)."""
  port = mp.free_port()
  codes, lines, seconds = _launch(tmp_path, 'missing', [_command(tmp_path, port, 2, 0, timeout=5)])
  assert codes == [1]
  assert lines[0].startswith(
    f'jaxprune-train: process 0 could not join the job at 127.0.0.1:{port} within 5 s of '
    'its start: a process is missing (not started, or stopped by an error of its own)'
  ), lines
  assert seconds < 15


def test_processes_given_different_settings_all_stop_naming_them(tmp_path):
  """Process 1 differs by 4 settings: both stop naming them, rather than train different
  programs, wait for each other or say they lost the other."""
  port = mp.free_port()
  other = tmp_path / 'other'
  codes, lines, seconds = _launch(
    tmp_path,
    'settings',
    [
      _command(tmp_path, port, 2, 0),
      _command(
        tmp_path,
        port,
        2,
        1,
        '--config.num_steps=70',
        '--heartbeat_timeout_seconds=50',
        '--config.seed=1',
        workdir=other,
      ),
    ],
  )
  assert codes == [1, 1], lines
  # The job's flags first, then the workdir, then the config's fields by name.
  expected = (
    'jaxprune-train: the processes of this job were given different settings: '
    '--heartbeat_timeout_seconds: 100 in process 0, 50 in process 1 (and 3 more: '
    '--workdir, --config.num_steps, --config.seed). Give every process the same flags'
  )
  assert [line[: len(expected)] for line in lines] == [expected, expected], lines
  assert seconds < 30
  assert not (tmp_path / 'run').exists() and not other.exists()  # nothing written


def test_a_flag_refused_in_one_process_stops_the_others_naming_it(tmp_path):
  """Process 1 alone refuses its pruning flag after joining: process 0 said "the job lost
  another process", and relaunching failed again."""
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path,
    'refused',
    [
      _command(tmp_path, port, 2, 0),
      _command(tmp_path, port, 2, 1, '--config.pruning.target_sparsity=1.5'),
    ],
  )
  assert codes == [1, 1], lines
  assert lines == [
    'jaxprune-train: process 1 of the job stopped (target_sparsity=1.5: must be in [0, 1).); '
    'fix its flags and start every process again.',
    'jaxprune-train: target_sparsity=1.5: must be in [0, 1).',
  ]
  assert seconds < 30


def test_ctrl_c_while_waiting_for_the_others_is_one_line_at_once(tmp_path):
  """JAX waits for the others inside C++, where Python's handler cannot run: Ctrl-C waited
  for the join's timeout, then JAX aborted the process (SIGABRT)."""
  port = mp.free_port()
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  command = _command(tmp_path, port, 2, 0, timeout=100)
  with mp.processes([command], 4, str(tmp_path), 'ctrl_c') as [started]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and started.poll() is None:
      with socket.socket() as probe:
        if probe.connect_ex(('127.0.0.1', port)) == 0:
          break  # process 0 listens: it is joining
      time.sleep(0.2)
    time.sleep(1)
    started.send_signal(signal.SIGINT)
    sent = time.monotonic()
    assert mp.wait_all([started], TIMEOUT) == [130]
    assert time.monotonic() - sent < 10
  assert mp.read(str(tmp_path), 'ctrl_c', 0).strip() == (
    'jaxprune-train: interrupted while joining the job; nothing was written.'
  )


def test_processes_exposing_different_device_counts_stop_with_one_line(tmp_path):
  """4 devices in process 0, 2 in process 1 (hosts with different GPU counts): both ended
  in a 42-line traceback ('cannot reshape array of size 6 into shape (2,2)')."""
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  port = mp.free_port()
  started = []
  try:
    for i, devices in enumerate((4, 2)):
      with open(tmp_path / f'devices.{i}.err', 'w') as err:
        started.append(
          subprocess.Popen(
            _command(tmp_path, port, 2, i),
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=mp.env(devices),
            cwd=tmp_path,
          )
        )
    codes = mp.wait_all(started, TIMEOUT)
  finally:
    for process in started:
      if process.poll() is None:
        process.kill()
      process.wait()
  errs = [mp.read(str(tmp_path), 'devices', i).strip().splitlines() for i in range(2)]
  assert codes == [1, 1], errs
  line = (
    'jaxprune-train: the processes of this job expose different numbers of devices (4 in '
    'process 0, 2 in process 1); every process must expose the same number'
  )
  assert [len(err) for err in errs] == [1, 1], errs
  assert [err[0][: len(line)] for err in errs] == [line, line], errs
  assert not (tmp_path / 'run').exists()  # nothing written
