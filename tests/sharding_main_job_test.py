"""`jaxprune-train` with `config.mesh_shape` on 8 simulated CPU devices.

Both tests run in subprocesses with `--xla_force_host_platform_device_count=8`
(the main test process has one CPU device).
"""

import json
import os
import subprocess
import sys
import textwrap

import cpu_devices
import pytest

ENV = cpu_devices.env(8)

# The crash tests' tiny config (tests/train_faults.py), pruned over steps 20-80.
TINY_CONFIG = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from train_faults import tiny_config


def get_config(mesh_shape=(), num_steps=100):
  return tiny_config(num_steps, prune_steps=(20, 80), eval_every=100, mesh_shape=mesh_shape)
"""

COMPARE = """
import json, sys
import jax, numpy as np
import jaxprune
from jaxprune_train import _loop as loop
import tiny

workdir = sys.argv[1]
one = loop.train(tiny.get_config(), None).state
# Sharded: 60 steps, then a second call resumes from the step-60 checkpoint.
loop.train(tiny.get_config((2, 4), num_steps=60), workdir)
many = loop.train(tiny.get_config((2, 4)), workdir).state
assert jax.device_count() == 8
masks_one, masks_many = jaxprune.get_masks(one.opt_state), jaxprune.get_masks(many.opt_state)
out = {'step': int(many.step), 'specs': {}, 'mask_specs': {}, 'errors': {}, 'mask_mismatches': {},
       'kept': {}}
for name, leaf in jaxprune.named_leaves(many.params):
  out['specs'][name] = str(leaf.sharding.spec)
for (name, a), (_, b) in zip(jaxprune.named_leaves(one.params), jaxprune.named_leaves(many.params)):
  a, b = np.asarray(a), np.asarray(b)
  out['errors'][name] = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
for (name, a), (_, b) in zip(jaxprune.named_leaves(masks_one), jaxprune.named_leaves(masks_many)):
  out['mask_specs'][name] = str(b.sharding.spec)
  out['mask_mismatches'][name] = int(np.sum(np.asarray(a) != np.asarray(b)))
  out['kept'][name] = [int(np.sum(np.asarray(a))), int(np.sum(np.asarray(b)))]
print(json.dumps(out))
"""


def _run(args, cwd):
  result = subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600
  )
  assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
  return result


@pytest.mark.slow
def test_sharded_run_resumes_and_agrees_with_one_device(tmp_path):
  (tmp_path / 'tiny.py').write_text(TINY_CONFIG)
  (tmp_path / 'compare.py').write_text(COMPARE)
  result = _run(['compare.py', str(tmp_path / 'run')], tmp_path)
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out['step'] == 100
  # Widths 32 and 16 split over the 4 'model' devices; the 10 logits do not divide.
  assert out['specs'] == {
    'Dense_0/bias': "P('model',)",
    'Dense_0/kernel': "P(None, 'model')",
    'Dense_1/bias': "P('model',)",
    'Dense_1/kernel': "P(None, 'model')",
    'Dense_2/bias': 'P()',
    'Dense_2/kernel': 'P()',
  }
  assert out['mask_specs'] == {
    'Dense_0/kernel': "P(None, 'model')",
    'Dense_1/kernel': "P(None, 'model')",
    'Dense_2/kernel': 'P()',
  }
  # What docs/guides/sharding.md says holds over a run. Gradients are summed over the 'data'
  # devices in another order than on one device, and training amplifies the
  # rounding: over these 100 steps the params still agree within 1e-4 and the
  # masks are identical (over the default 3,000-step run they do not).
  assert out['mask_mismatches'] == {name: 0 for name in out['mask_specs']}
  assert max(out['errors'].values()) < 1e-4, out['errors']
  # The exact method keeps round(N * 0.2) weights of each kernel on any mesh:
  # 64*32 = 2048 -> 410, 32*16 = 512 -> 102, 16*10 = 160 -> 32.
  assert out['kept'] == {
    'Dense_0/kernel': [410, 410],
    'Dense_1/kernel': [102, 102],
    'Dense_2/kernel': [32, 32],
  }


@pytest.mark.slow
@pytest.mark.parametrize(
  'mesh_shape, message',
  [
    ('(2,4)', None),
    ('(3,3)', 'uses 9 devices but 8 are available'),
  ],
)
def test_command_line_mesh_shape(tmp_path, mesh_shape, message):
  (tmp_path / 'tiny.py').write_text(TINY_CONFIG)
  args = [
    '-m',
    'jaxprune_train',
    '--config',
    str(tmp_path / 'tiny.py'),
    f'--config.mesh_shape={mesh_shape}',
    '--config.num_steps=20',
    f'--workdir={tmp_path / "run"}',
  ]
  if message is None:
    result = _run(args, tmp_path)
    assert 'jaxprune-train' in result.stdout
    assert os.path.exists(tmp_path / 'run' / 'report.txt')
    return
  result = subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600
  )
  assert result.returncode == 1
  # One line, without a traceback.
  assert result.stderr.splitlines() == [
    f'jaxprune-train: mesh_shape=(3, 3) {message}; make the '
    'product of the sizes equal the device count, or use () '
    'for one device.'
  ], textwrap.shorten(result.stderr, 2000)
