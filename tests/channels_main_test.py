"""The main job with channel pruning: the shrunk model's artifact, report and metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxprune_train import ConfigError
from jaxprune_train import _data as data
from jaxprune_train import _loop as loop
from jaxprune_train._metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config():
  sys.path.insert(0, os.path.join(ROOT, 'configs'))
  try:
    import digits_cnn_channels
  finally:
    sys.path.pop(0)
  config = digits_cnn_channels.get_config()
  # The config's schedule, compressed: dense 60 steps, 50% of the channels by step 180.
  config.num_steps = 240
  config.pruning.update(
    {
      'begin_pruning_step': 60,
      'end_pruning_step': 180,
      'sparsity_function_begin_step': 60,
      'sparsity_function_end_step': 180,
      'pruning_frequency': 20,
    }
  )
  config.eval_every = config.checkpoint_every = 120
  config.progress_bar = config.tensorboard = config.plots = False
  return config


@pytest.mark.slow
def test_channel_run_exports_a_model_that_reloads_in_a_fresh_process(tmp_path):
  workdir = str(tmp_path / 'run')
  loop.train(_config(), workdir)
  final = [r for r in read_metrics(workdir) if 'flops_kept' in r][-1]

  # 8x8x1 digits, 3x3 SAME convs, 2x2 pools (8 -> 4 -> 2), 2 FLOPs per multiply-add:
  # dense 16, 32 channels and 64 hidden units; shrunk 8, 16 and 32.
  def flops(c1, c2, hidden):
    return 2 * (64 * 9 * c1 + 16 * 9 * c1 * c2 + 4 * c2 * hidden + hidden * 10)

  assert final['flops_before'] == flops(16, 32, 64)
  assert final['flops_after'] == flops(8, 16, 32)
  # after / before, the one convention (PruneResult, channels.Shrunk, the report).
  assert final['flops_kept'] == pytest.approx(flops(8, 16, 32) / flops(16, 32, 64))
  assert final['speedup'] > 0
  report = open(os.path.join(workdir, loop.REPORT_FILE)).read()
  assert f'{final["test_accuracy"]:.2%}' in report and 'Conv_1/kernel:3     16 / 32' in report

  # A fresh process: only jax, the artifact and the test split.
  dataset = data.load_digits()
  np.savez(tmp_path / 'test.npz', x=dataset.x_test, y=dataset.y_test)
  script = textwrap.dedent(f"""
      import json, jax, numpy as np
      with open({os.path.join(workdir, 'pruned_model.bin')!r}, 'rb') as f:
        exported = jax.export.deserialize(bytearray(f.read()))
      split = np.load({str(tmp_path / 'test.npz')!r})
      x, y = split['x'], split['y']
      logits = np.concatenate([np.asarray(exported.call(x[i:i + 7])) for i in range(0, len(x), 7)])
      one = np.asarray(exported.call(x[:1]))
      print(json.dumps({{'accuracy': float(np.mean(logits.argmax(-1) == y)),
                        'shape1': one.shape, 'shape7': exported.call(x[:7]).shape,
                        'same': bool(np.allclose(one, logits[:1], atol=1e-5)),
                        'shapes_in': str(exported.in_avals)}}))
      """)
  out = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    check=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got['accuracy'] == final['test_accuracy'] > 0.8
  assert got['shape1'] == [1, 10] and got['shape7'] == [7, 10] and got['same']
  assert got['shapes_in'] == '(ShapedArray(float32[b,8,8,1]),)'


def test_bad_channel_settings_are_named():
  config = _config()
  config.channels.round_to = 0
  with pytest.raises(ConfigError, match='channels.round_to'):
    loop.train(config)
  config = _config()
  config.pruning.block_height = 2
  with pytest.raises(ConfigError, match='block_height'):
    loop.train(config)


def test_a_channel_run_without_flatbuffers_is_refused_before_training(tmp_path, monkeypatch):
  # The run ends by serialising pruned_model.bin; without flatbuffers that would
  # fail after the whole training. It is refused at the start, in one line.
  monkeypatch.setitem(sys.modules, 'flatbuffers', None)  # `import flatbuffers` fails
  with pytest.raises(ConfigError, match='pip install flatbuffers'):
    loop.train(_config(), str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')
