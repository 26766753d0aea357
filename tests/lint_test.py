"""`ruff check` (the rules in pyproject.toml) is part of the suite, so CI runs it."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_is_clean():
  ruff = shutil.which('ruff') or os.path.join(os.path.dirname(sys.executable), 'ruff')
  result = subprocess.run([ruff, 'check', 'jaxprune', 'tests', 'benchmarks', 'configs',
                           'conftest.py', 'docs/conf.py'], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
