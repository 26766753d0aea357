"""Runs the README's quick start exactly as written, and checks the output it shows."""

import contextlib
import io
import os

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'README.md')


@pytest.mark.slow
def test_quickstart_code_runs_prunes_and_prints_what_the_readme_shows():
  with open(README) as f:
    text = f.read()
  start = text.index('```python', text.index('## Quick start')) + len('```python\n')
  end = text.index('```', start)
  code = text[start:end]
  shown_start = text.index('```\n', end + 3) + len('```\n')
  shown = text[shown_start : text.index('```', shown_start)]
  namespace = {}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, 'README.md', 'exec'), namespace)  # noqa: S102
  assert out.getvalue() == shown
  import jaxprune

  masks = jaxprune.get_masks(namespace['opt_state'])
  kept = {
    f'{layer}/kernel': int(masks[layer]['kernel'].sum())
    for layer in masks
    if masks[layer]['kernel'] is not None
  }
  # The exact rule keeps round(N * (1 - s)) weights of each kernel: the targets exactly.
  assert kept == {'layers_0/kernel': 1920, 'layers_2/kernel': 3000, 'layers_4/kernel': 500}
  sparsity = jaxprune.get_weight_sparsity(namespace['params'])
  assert {k: int(round(float(v) * 1000)) for k, v in sparsity.items()} == {
    'layers_0/kernel': 900,
    'layers_2/kernel': 900,
    'layers_4/kernel': 500,
  }
