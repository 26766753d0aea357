"""Multi-process jobs that cannot start end in one line per process and a non-zero status,
within seconds: processes given different sizes or the same id, a coordinator port in use."""

import socket
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


def _command(tmp_path, port, num_processes, process_id):
  return [
    sys.executable,
    '-m',
    'jaxprune.train',
    '--config',
    str(tmp_path / 'tiny.py'),
    f'--workdir={tmp_path / "run"}',
    f'--coordinator_address=127.0.0.1:{port}',
    f'--num_processes={num_processes}',
    f'--process_id={process_id}',
    '--initialization_timeout_seconds=10',
  ]


def _launch(tmp_path, name, commands):
  """(exit statuses, last stderr line of each process, seconds until all ended)."""
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  start = time.monotonic()
  with mp.processes(commands, 4, str(tmp_path), name) as started:
    codes = mp.wait_all(started, TIMEOUT)
  lines = [mp.read(str(tmp_path), name, i).strip().splitlines()[-1] for i in range(len(commands))]
  return codes, lines, time.monotonic() - start


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
  assert not (tmp_path / 'run').exists() or not any((tmp_path / 'run').glob('checkpoints/*'))


def test_two_processes_with_one_id_stop_with_one_line_each(tmp_path):
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path, 'same', [_command(tmp_path, port, 2, 0), _command(tmp_path, port, 2, 0)]
  )
  assert all(code != 0 for code in codes), (codes, lines)
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
  """Both given --process_id=1: no process runs the coordination service (this hung)."""
  port = mp.free_port()
  codes, lines, seconds = _launch(
    tmp_path, 'none', [_command(tmp_path, port, 2, 1), _command(tmp_path, port, 2, 1)]
  )
  assert all(code != 0 for code in codes), (codes, lines)
  for line in lines:
    assert line.startswith('jaxprune-train: process 1 could not join the job at '), line
  assert seconds < 60
