"""`jaxprune-train` as 2 processes x 4 CPU devices joined by `jax.distributed` (127.0.0.1, gloo).

The processes are real subprocesses; every test kills what is left of them on
the way out. The runs (`train_multiprocess.py`) are the tiny MLP and a tiny
channel-pruning CNN on a 2x4 mesh, 60 steps with mask updates at steps 20-50.
"""

import fcntl
import json
import os
import re
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import train_multiprocess as mp

from jaxprune_train import _files as files

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(mp.HERE, 'train_multiprocess.py')
TIMEOUT = 600  # seconds for any launch; the shared CI machine is slow, a hang is far slower
HEARTBEAT = 10
CONFIG_FILE = f"""
import sys
sys.path.insert(0, {mp.HERE!r})
from train_multiprocess import configs


def get_config():
  return configs()['mlp'](60)
"""


def _arrays(path):
  with np.load(path) as npz:
    return {name: npz[name] for name in npz.files}


def _run_all(root):
  """2 processes x 4 devices, and 1 process x 8 devices with gloo and with JAX's default
  CPU collectives, launched side by side; their outputs in `root/<name>`."""
  for name in ('two', 'one_gloo', 'one_default'):
    (root / name).mkdir()
  port, port_one = mp.free_port(), mp.free_port()
  start = time.monotonic()
  with (
    mp.processes(
      [[sys.executable, SCRIPT, '2', str(i), str(port), str(root / 'two')] for i in range(2)],
      4,
      str(root),
      'two',
    ) as two,
    mp.processes(
      [[sys.executable, SCRIPT, '1', '0', str(port_one), str(root / 'one_gloo')]],
      8,
      str(root),
      'one_gloo',
    ) as one_gloo,
    mp.processes(
      [[sys.executable, SCRIPT, '1', '0', '0', str(root / 'one_default')]],
      8,
      str(root),
      'one_default',
    ) as one_default,
  ):
    for name, started in (('two', two), ('one_gloo', one_gloo), ('one_default', one_default)):
      codes = mp.wait_all(started, TIMEOUT - (time.monotonic() - start))
      assert codes == [0] * len(started), (name, mp.read(str(root), name, 0)[-3000:])


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The script's outputs (`_run_all`)."""
  root = tmp_path_factory.mktemp('multiprocess')
  _run_all(root)
  return {name: root / name for name in ('two', 'one_gloo', 'one_default')}


@pytest.mark.parametrize('name', ['mlp', 'channels'])
def test_two_processes_end_as_one_process_with_eight_devices(runs, name):
  for step in mp.STEPS:
    two = _arrays(runs['two'] / f'{name}-{step}.npz')
    gloo = _arrays(runs['one_gloo'] / f'{name}-{step}.npz')
    default = _arrays(runs['one_default'] / f'{name}-{step}.npz')
    assert two.keys() == gloo.keys() == default.keys()
    for leaf, value in two.items():
      # The same program on the same 2x4 mesh with the same collectives: bit for bit,
      # after the first mask update that prunes (step 31) and at the end (step 60).
      np.testing.assert_array_equal(value, gloo[leaf], err_msg=f'{name} {step} {leaf}')
      # JAX's in-process collectives sum across devices in another order: the
      # bound docs/guides/sharding.md gives, and the same masks (zeros) in every kernel.
      scale = np.max(np.abs(default[leaf]))
      assert np.max(np.abs(value - default[leaf])) <= 1e-5 * scale, (name, step, leaf)
      np.testing.assert_array_equal(value == 0, default[leaf] == 0, err_msg=leaf)
  # The masks prune: at step 60 each MLP kernel keeps round(0.2 * size) weights
  # (2048 -> 410, 512 -> 102, 160 -> 32 kept; the schedule ends at 80% on step 50).
  if name == 'mlp':
    final = _arrays(runs['two'] / f'{name}-60.npz')
    assert [int(np.sum(final[f"['Dense_{i}']['kernel']"] != 0)) for i in range(3)] == [410, 102, 32]


def _meta(workdir, step):
  with open(os.path.join(workdir, 'checkpoints', str(step), 'meta', 'metadata')) as f:
    return json.load(f)


def _launch_cli(tmp_path, workdir, name, port, extra=()):
  return mp.processes(
    [
      [
        sys.executable,
        '-m',
        'jaxprune_train',
        '--config',
        str(tmp_path / 'tiny.py'),
        f'--workdir={workdir}',
        f'--coordinator_address=127.0.0.1:{port}',
        '--num_processes=2',
        f'--process_id={i}',
        f'--heartbeat_timeout_seconds={HEARTBEAT}',
        # From each process's start: room for a loaded machine to import JAX in both.
        '--initialization_timeout_seconds=60',
        *extra,
      ]
      for i in range(2)
    ],
    4,
    str(tmp_path),
    name,
  )


def _kill_after_checkpoint(tmp_path, workdir, name, step, victim):
  """Launches the 2 processes, kills `victim` (SIGKILL) once checkpoint `step` exists,
  and returns the other's exit status and last stderr line once it has stopped."""
  with _launch_cli(tmp_path, workdir, name, mp.free_port()) as started:
    newest = os.path.join(workdir, 'checkpoints', str(step))
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(newest) and time.monotonic() < deadline:
      assert started[0].poll() is None and started[1].poll() is None
      time.sleep(0.1)
    started[victim].kill()
    killed_at = time.monotonic()
    codes = mp.wait_all(started, TIMEOUT)
    # Bounded: at once in a collective or when the coordinator is gone, else
    # after the heartbeat timeout.
    assert time.monotonic() - killed_at < HEARTBEAT + 30
  survivor = 1 - victim
  err = mp.read(str(tmp_path), name, survivor)
  # JAX's distributed runtime logs (glog: 'E1128 03:03:31.55 5169 coordination_...') are
  # replaced by the job's one line, as its fatal message is.
  assert not re.search(r'^[EWF]\d{4} [\d:.]+ +\d+ ', err, re.M), err[-3000:]
  return codes[survivor], err.strip().splitlines()[-1]


def test_kill_one_process_then_relaunch_resumes_bit_for_bit(tmp_path, runs):
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  workdir = str(tmp_path / 'run')
  reference = str(runs['two'] / 'mlp')
  line = (
    r'jaxprune-train: process {} of 2: the job lost another process \(.+\); stopping\. '
    r'Launch the same 2 commands again to resume from the newest checkpoint\.'
  )
  # The survivor exits with status 1 when it fails in a collective with the dead
  # process; when JAX's coordination service stops it first (at once when process 0,
  # which runs the service, died), JAX aborts it and the job's line replaces JAX's
  # message and stack trace.
  for name, step, victim in (('kill0', 20, 0), ('kill1', 40, 1)):
    code, last = _kill_after_checkpoint(tmp_path, workdir, name, step, victim)
    assert code in (1, -signal.SIGABRT), (name, code, last)
    assert re.fullmatch(line.format(1 - victim), last), (name, code, last)

  with _launch_cli(tmp_path, workdir, 'resumed', mp.free_port()) as started:
    assert mp.wait_all(started, TIMEOUT) == [0, 0], mp.read(str(tmp_path), 'resumed', 0)[-3000:]
  out = mp.read(str(tmp_path), 'resumed', 0, 'out')
  assert re.search(r'Resuming from the checkpoint of step (20|40) in ', out), out
  # Only process 0 prints the report and writes the files.
  assert 'test accuracy:' in out
  assert 'test accuracy:' not in mp.read(str(tmp_path), 'resumed', 1, 'out')
  # The final params and optimizer state, bit for bit (a CRC-32 of every array, over the
  # whole array), the metrics history and the report are the uninterrupted run's.
  assert _meta(workdir, 60)['checksums'] == _meta(reference, 60)['checksums']
  for name in ('metrics.jsonl', 'report.txt'):
    with open(os.path.join(workdir, name)) as ours, open(os.path.join(reference, name)) as ref:
      assert ours.read() == ref.read(), name


def test_relaunch_with_another_layout_restores_or_refuses(tmp_path, runs):
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  workdir = str(tmp_path / 'run')
  shutil.copytree(runs['two'] / 'mlp', workdir)  # the 2-process run, at step 60
  command = [
    sys.executable,
    '-m',
    'jaxprune_train',
    '--config',
    str(tmp_path / 'tiny.py'),
    f'--workdir={workdir}',
  ]
  # Another mesh: refused before anything is written, in one line naming it.
  with mp.processes([[*command, '--config.mesh_shape=(4,2)']], 8, str(tmp_path), 'mesh') as started:
    assert mp.wait_all(started, TIMEOUT) == [1]
  [line] = mp.read(str(tmp_path), 'mesh', 0).strip().splitlines()
  assert line.startswith(
    f'jaxprune-train: --workdir={workdir!r} holds a run with a different config'
  ), line
  assert 'config.mesh_shape: [2, 4] in the saved run, [4, 2] now' in line
  # One process with all 8 devices: the two processes' shards are read back into its
  # devices (each array checked against its checksum) and the run goes on.
  with mp.processes(
    [
      [
        *command,
        '--config.num_steps=70',
        '--num_processes=1',
        f'--coordinator_address=127.0.0.1:{mp.free_port()}',
      ]
    ],
    8,
    str(tmp_path),
    'one',
  ) as started:
    assert mp.wait_all(started, TIMEOUT) == [0], mp.read(str(tmp_path), 'one', 0)[-3000:]
  out = mp.read(str(tmp_path), 'one', 0, 'out')
  assert f'Resuming from the checkpoint of step 60 in {workdir}.' in out
  assert 'final (step 70)' in out


def test_a_workdir_in_use_is_refused_by_every_process(tmp_path):
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  # Another run holds the lock (pid 4242): process 0 finds it, and tells the other.
  with open(workdir / files.LOCK_FILE, 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write('4242\n')
    lock.flush()
    with _launch_cli(tmp_path, str(workdir), 'busy', mp.free_port()) as started:
      assert mp.wait_all(started, TIMEOUT) == [1, 1]
  expected = (
    f'jaxprune-train: --workdir={str(workdir)!r} is in use by another jaxprune-train '
    'run (pid 4242); wait for it to end, or give this run another --workdir.'
  )
  for i in range(2):
    assert mp.read(str(tmp_path), 'busy', i).strip().splitlines()[-1] == expected
  assert sorted(os.listdir(workdir)) == [files.LOCK_FILE]  # nothing written


def test_a_damaged_checkpoint_is_set_aside_by_the_job(tmp_path, runs):
  (tmp_path / 'tiny.py').write_text(CONFIG_FILE)
  workdir = str(tmp_path / 'run')
  reference = str(runs['two'] / 'mlp')
  shutil.copytree(reference, workdir)  # the 2-process run: checkpoints 40 and 60
  data_dir = os.path.join(workdir, 'checkpoints', '60', 'state', 'd')
  path = max((os.path.join(data_dir, name) for name in os.listdir(data_dir)), key=os.path.getsize)
  with open(path, 'r+b') as f:  # one flipped bit in the arrays' data file
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x10]))
  with _launch_cli(tmp_path, workdir, 'damaged', mp.free_port()) as started:
    assert mp.wait_all(started, TIMEOUT) == [0, 0], mp.read(str(tmp_path), 'damaged', 0)[-3000:]
  warned = [
    line for line in mp.read(str(tmp_path), 'damaged', 0).splitlines() if 'is damaged' in line
  ]
  assert len(warned) == 1 and warned[0].startswith(
    f'jaxprune-train: warning: the checkpoint {workdir}/checkpoints/60 is damaged: '
  )
  assert warned[0].endswith(
    f'moved it to {workdir}/damaged_checkpoints/60 and resumed from the checkpoint of step 40.'
  )
  assert 'is damaged' not in mp.read(str(tmp_path), 'damaged', 1)  # said once, by process 0
  assert 'Resuming from the checkpoint of step 40' in mp.read(str(tmp_path), 'damaged', 0, 'out')
  # Trained again from step 40: the step-60 checkpoint is the uninterrupted run's.
  assert _meta(workdir, 60)['checksums'] == _meta(reference, 60)['checksums']
