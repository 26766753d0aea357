"""The main job's progress: tqdm's bar on a terminal, whole lines in a log file."""

import io
import os
import subprocess
import sys

import pytest
import tqdm

from jaxprune_train import _progress as progress

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), 'jaxprune-train')


class Clock:
  """Half a second per call after the first."""

  def __init__(self):
    self.now = -0.5

  def __call__(self):
    self.now += 0.5
    return self.now


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_in_a_file_a_line_at_each_tenth_and_every_so_often():
  out = io.StringIO()
  # Resumed at step 20 of 50; a step every 0.5 s, a line at least every second.
  bar = progress.PlainProgress(50, 20, out, clock=Clock(), every_seconds=1.0)
  for step in range(21, 31):
    if step == 25:
      bar.set_postfix(loss='0.500', acc='0.900')
    bar.update(1)
  bar.close()
  # A second after the last line: steps 22, 24, 27, 29 (2 steps in 1 s); the tenths of 50:
  # 25 and 30 (1 step in the 0.5 s since the line before).
  assert out.getvalue().splitlines() == [
    'step 22/50 (44%), 2.0 steps/s',
    'step 24/50 (48%), 2.0 steps/s',
    'step 25/50 (50%), 2.0 steps/s: loss=0.500, acc=0.900',
    'step 27/50 (54%), 2.0 steps/s: loss=0.500, acc=0.900',
    'step 29/50 (58%), 2.0 steps/s: loss=0.500, acc=0.900',
    'step 30/50 (60%), 2.0 steps/s: loss=0.500, acc=0.900',
  ]


def test_a_line_only_at_the_tenths_when_the_steps_are_fast():
  out = io.StringIO()
  bar = progress.PlainProgress(30, 0, out, clock=Clock())  # every 60 s: never here
  for _ in range(30):
    bar.update(1)
  # The tenths of 30: every 3 steps, 1.5 s apart.
  assert out.getvalue().splitlines() == [
    f'step {step}/30 ({step * 10 // 3}%), 2.0 steps/s' for step in range(3, 31, 3)
  ]


def test_a_terminal_gets_the_bar_and_a_file_the_lines():
  assert isinstance(progress.progress(10, 0, True, Terminal()), tqdm.tqdm)
  assert isinstance(progress.progress(10, 0, True, io.StringIO()), progress.PlainProgress)
  off = progress.progress(10, 0, False, io.StringIO())
  assert isinstance(off, tqdm.tqdm) and off.disable


@pytest.mark.slow
def test_the_job_writes_whole_lines_to_a_log_file(tmp_path):
  """As a job scheduler runs it, stderr to a file: tqdm's bar was one line of carriage
  returns there."""
  log = tmp_path / 'job.err'
  with open(log, 'w') as err:
    result = subprocess.run(
      [
        SCRIPT,
        f'--workdir={tmp_path / "run"}',
        '--config.num_steps=60',
        '--config.eval_every=30',
        '--config.checkpoint_every=60',
        '--config.plots=False',
        '--config.pruning.begin_pruning_step=10',
        '--config.pruning.sparsity_function_begin_step=10',
        '--config.pruning.end_pruning_step=50',
        '--config.pruning.sparsity_function_end_step=50',
        '--config.pruning.pruning_frequency=10',
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=err,
      text=True,
      timeout=300,
    )
  text = log.read_bytes().decode()  # as written: read_text() makes each '\r' a line end
  assert result.returncode == 0, text
  assert '\r' not in text, text[:300]
  lines = [line for line in text.splitlines() if line.startswith('step ')]
  # The tenths of 60 (every 6 steps); the loss and accuracy from the first logged step on.
  assert [line.split(' (')[0] for line in lines] == [f'step {s}/60' for s in range(6, 61, 6)]
  assert all(' steps/s' in line for line in lines), lines
  assert 'loss=' in lines[-1] and 'sparsity=' in lines[-1], lines
  # The evaluations' lines stay on stdout.
  assert 'step 30: test accuracy' in result.stdout
