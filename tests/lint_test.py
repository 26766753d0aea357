"""`ruff check` and `ruff format --check` (pyproject.toml's rules and style) are part of the
suite, so CI runs them."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = [
  'jaxprune',
  'jaxprune_train',
  'tests',
  'benchmarks',
  'configs',
  'conftest.py',
  'docs/conf.py',
]


def _ruff(*args):
  ruff = shutil.which('ruff') or os.path.join(os.path.dirname(sys.executable), 'ruff')
  return subprocess.run(
    [ruff, *args, *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300
  )


def test_ruff_check_is_clean():
  result = _ruff('check')
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
  result = _ruff('format', '--check')
  assert result.returncode == 0, (
    'run `ruff format` (the style is in pyproject.toml):\n'
    + result.stdout[-4000:]
    + result.stderr[-2000:]
  )
