"""Ctrl-C outside the training steps (starting, setting up, after the last checkpoint): one
line, status 130, never a crash and never lost."""

import os
import signal
import subprocess
import sys
import time

import cpu_devices
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ctrl_c_while_starting_is_one_line():
  script = (
    'import os, signal, time\n'
    'from jaxprune_train import _process\n'
    "_process.end_at_once(lambda: 'jaxprune-train: interrupted while starting; nothing was "
    "written.')\n"
    'os.kill(os.getpid(), signal.SIGINT)\n'
    'time.sleep(30)\n'
  )
  result = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    timeout=120,
    env=cpu_devices.env(1),
    cwd=ROOT,
  )
  assert result.returncode == 130
  assert result.stderr.strip().splitlines() == [
    'jaxprune-train: interrupted while starting; nothing was written.'
  ]


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_is_one_line(tmp_path):
  """Sent as soon as the job names its workdir, while JAX starts and compiles: the job
  ends with status 130 and its one line, not a crash (status -11) or a claimed checkpoint."""
  workdir = tmp_path / 'run'
  job = subprocess.Popen(
    [sys.executable, '-m', 'jaxprune_train', '--config.num_steps=3000', f'--workdir={workdir}'],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=cpu_devices.env(1),
    cwd=ROOT,
  )
  deadline = time.monotonic() + 120
  for line in job.stdout:
    if 'workdir' in line or time.monotonic() > deadline:
      break
  job.send_signal(signal.SIGINT)
  _, err = job.communicate(timeout=120)
  last = err.strip().splitlines()[-1]
  assert job.returncode == 130, (job.returncode, err[-2000:])
  checkpoints = workdir / 'checkpoints'
  if checkpoints.is_dir() and any(checkpoints.iterdir()):  # training had written one
    assert last.startswith('Interrupted; run the same command again to resume'), last
  else:
    assert last == (
      f'jaxprune-train: interrupted before the first checkpoint of {workdir}; '
      'run the same command again to start the run.'
    ), last


# A config file that sends this process SIGINT from inside a garbage collection (a gc
# callback, as JAX's own are), run as `TARGET` (in _loop.py) starts. Python's handler
# raises KeyboardInterrupt there, where it is printed as 'Exception ignored' and lost.
INTERRUPTING_CONFIG = """
import functools, gc, os, signal, sys
sys.path.insert(0, {tests!r})
from train_faults import tiny_config
from jaxprune_train import _loop

armed = []


def interrupt(phase, info):
  if armed and phase == 'start':
    armed.clear()
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10000):  # the handler runs here, inside the collection
      pass


def collect_first(fn):
  @functools.wraps(fn)
  def collecting(*args, **kwargs):
    armed.append(True)
    gc.collect()
    return fn(*args, **kwargs)

  return collecting


gc.callbacks.append(interrupt)
{target} = collect_first({target})


def get_config():
  return tiny_config(20, prune_steps=(5, 14), eval_every=20)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
  'target, line',
  [
    (
      '_loop._build',
      'interrupted before the first checkpoint of {workdir}; run the same command '
      'again to start the run.',
    ),
    (
      '_loop._Run._finish',
      'interrupted after the last checkpoint (step 20): the run in {workdir} is '
      'complete; the same command again writes its report.',
    ),
  ],
  ids=['setting_up', 'after_the_last_checkpoint'],
)
def test_ctrl_c_inside_a_garbage_collection_is_never_lost(tmp_path, target, line):
  """While the job builds its model and step (Ctrl-C there was lost in 1 of 18 tries),
  and after its last checkpoint (a Ctrl-C there ended it with status -2 and no line)."""
  config = tmp_path / 'interrupting.py'
  config.write_text(INTERRUPTING_CONFIG.format(tests=os.path.join(ROOT, 'tests'), target=target))
  workdir = tmp_path / 'run'
  result = subprocess.run(
    [sys.executable, '-m', 'jaxprune_train', '--config', str(config), f'--workdir={workdir}'],
    capture_output=True,
    text=True,
    timeout=300,
    env=cpu_devices.env(1),
    cwd=ROOT,
  )
  assert result.returncode == 130, (result.returncode, result.stderr[-2000:])
  assert result.stderr.strip().splitlines() == [f'jaxprune-train: {line.format(workdir=workdir)}']


def test_the_line_says_what_a_rerun_does(tmp_path):
  """By the checkpoints renamed into place; orbax's temporary directory is not one."""
  from jaxprune_train import _main

  workdir = tmp_path / 'run'
  assert _main._interrupted(str(workdir), 60) == (
    f'interrupted before the first checkpoint of {workdir}; run the same command again to '
    'start the run.'
  )
  (workdir / 'checkpoints' / '20').mkdir(parents=True)
  (workdir / 'checkpoints' / '40.orbax-checkpoint-tmp-3').mkdir()
  assert _main._interrupted(str(workdir), 60) == (
    'interrupted; run the same command again to resume from the newest checkpoint '
    f'(step 20) in {workdir}.'
  )
  (workdir / 'checkpoints' / '60').mkdir()
  assert _main._interrupted(str(workdir), 60) == (
    f'interrupted after the last checkpoint (step 60): the run in {workdir} is complete; the '
    'same command again writes its report.'
  )
