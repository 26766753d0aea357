"""A short sharded training run (adam + pruning) agrees with one device.

Runs tests/sharding_multidevice.py in a subprocess with 8 simulated CPU
devices: a 64-128-64-16 MLP, 16 steps of adam with mask updates every 4 steps
(exact k-th magnitude, 4x4 blocks on one kernel), in the data parallel, 2x4
model parallel and FSDP layouts. Gradients are summed across devices in
another order than on one device, so params agree to float rounding, and a
mask may differ only for a weight within rounding distance of its threshold.
"""

import json
import os
import subprocess
import sys

import cpu_devices
import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), 'sharding_multidevice.py')


@pytest.fixture(scope='module')
def runs():
  env = cpu_devices.env(8)
  result = subprocess.run(
    [sys.executable, SCRIPT, 'train', 'exact'], capture_output=True, text=True, env=env, timeout=600
  )
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize('layout', ['data_parallel', 'model_parallel', 'fsdp'])
def test_training_agrees_with_one_device(runs, layout):
  run = runs[layout]
  # Each differing mask entry must be a weight within 1e-4 (relative) of the threshold.
  assert run['mismatches_far_from_threshold'] == 0, run
  assert run['mask_mismatches'] <= 2, run
  assert run['max_relative_param_error'] < 1e-5, run
  names = sorted(run['ref_thresholds'])
  assert names == ['Dense_0/kernel', 'Dense_1/kernel', 'Dense_2/kernel']
  np.testing.assert_allclose(
    [run['thresholds'][n] for n in names], [run['ref_thresholds'][n] for n in names], rtol=1e-5
  )
  # The run pruned: 70% of each kernel at the end of the schedule (step 12).
  for name in names:
    assert 0.69 <= run['sparsity'][name] <= 0.71, (name, run['sparsity'])
