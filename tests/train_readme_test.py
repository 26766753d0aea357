"""Runs the README's quick start exactly as written."""

import contextlib
import io
import os

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'README.md')


def test_quickstart_code_runs_and_prunes():
  with open(README) as f:
    text = f.read()
  start = text.index('```python', text.index('## Quick start')) + len('```python\n')
  code = text[start:text.index('```', start)]
  namespace = {}
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(code, 'README.md', 'exec'), namespace)  # noqa: S102
  import jaxprune
  sparsity = {k: float(v) for k, v in jaxprune.get_weight_sparsity(namespace['params']).items()}
  # The histogram threshold lands at most one bin (of 256) below the target.
  assert 0.9 - 1 / 256 <= sparsity['layers_0/kernel'] <= 0.9
  assert 0.9 - 1 / 256 <= sparsity['layers_2/kernel'] <= 0.9
  assert 0.5 - 1 / 256 <= sparsity['layers_4/kernel'] <= 0.5
