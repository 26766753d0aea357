"""jaxprune.sparse sharded like the params on 8 simulated CPU devices, bit-identical to one.

Runs tests/sparse_multidevice.py in a subprocess (the device count is fixed
when jax is imported).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # one subprocess, ~40 s of CPU on 2 cores

SCRIPT = os.path.join(os.path.dirname(__file__), 'sparse_multidevice.py')


@pytest.fixture(scope='module')
def results():
  done = subprocess.run(
    [sys.executable, SCRIPT], capture_output=True, text=True, check=False, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('rule', ['static', 'set', 'rigl', 'ste', 'ste_nm'])
@pytest.mark.parametrize('layout', ['model_parallel', 'fsdp'])
def test_sharded_training_is_bit_identical(results, rule, layout):
  got = results['auto'][rule][layout]
  assert got['params_equal'], got
  assert got['state_equal'], got
  assert got['masks_like_params'], got
  # Static masks never change; the others do within 6 steps (updates at steps 2 and 4).
  assert got['masks_changed'] == (rule != 'static'), got


@pytest.mark.parametrize('rule', ['static', 'set', 'rigl', 'ste', 'ste_nm'])
def test_explicit_mesh_axes(results, rule):
  got = results['explicit'][rule]
  assert got.get('equal'), got
  assert got['masks_changed'] == (rule != 'static'), got
