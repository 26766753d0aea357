"""The sharding guide's example (docs/guides/sharding.md) runs on 8 simulated CPU devices."""

import os
import subprocess
import sys

import pytest
from docs_blocks import code_cells


def _example() -> str:
  setup, example = code_cells('guides/sharding.md')  # setup: the XLA_FLAGS of 8 devices
  assert 'xla_force_host_platform_device_count=8' in setup
  return example


@pytest.mark.slow
def test_docs_sharding_example(tmp_path):
  code = _example()
  script = tmp_path / 'example.py'
  script.write_text(code)
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  result = subprocess.run(
    [sys.executable, str(script)],
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
    cwd=tmp_path,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  printed = result.stdout.strip().splitlines()
  assert printed == [
    "{'Dense_0/kernel': 0.8, 'Dense_1/kernel': 0.8}",
    "P(None, 'model')",
    "P(None, 'model')",
  ]
