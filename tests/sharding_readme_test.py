"""The README's multi-device example runs on 8 simulated CPU devices and prints what it says."""

import os
import subprocess
import sys

from readme_blocks import python_blocks


def _example() -> str:
  blocks = python_blocks('<!-- section:sharding -->')
  assert len(blocks) == 1, 'the sharding section has one python example'
  return blocks[0]


def test_readme_sharding_example(tmp_path):
  code = _example()
  script = tmp_path / 'example.py'
  script.write_text(code)
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-4000:]
  # The comments under each print are the output the README promises.
  promised = [line[2:] for line in code.splitlines()
              if line.startswith('# ') and not line.startswith('# jax.')
              and ('{' in line or 'P(' in line)]
  printed = result.stdout.strip().splitlines()
  assert printed == promised
  assert promised == ["{'Dense_0/kernel': 0.8, 'Dense_1/kernel': 0.8}",
                      "P(None, 'model')", "P(None, 'model')"]
