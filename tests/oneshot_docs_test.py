"""The one-shot guide's example (docs/guides/oneshot.md) runs and prints these numbers."""

import contextlib
import io
import os
import re
import warnings

import pytest
from docs_blocks import DOCS, code_cells


@pytest.mark.slow
def test_docs_oneshot_example():
  blocks = code_cells('guides/oneshot.md')
  assert len(blocks) == 1, 'the one-shot guide has one code cell'
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(blocks[0], 'docs/guides/oneshot.md', 'exec'), {})
  printed = out.getvalue().strip().splitlines()
  assert printed[:4] == [
    'magnitude: relative output error 0.109',
    'wanda: relative output error 0.092',
    'sparsegpt: relative output error 0.033',
    'ria: relative output error 0.077',
  ]
  errors = [float(line.split()[-1]) for line in printed[:4]]
  assert errors[2] < errors[1] < errors[0]  # SparseGPT < Wanda < magnitude here
  assert printed[4:] == ['True', 'None']


@pytest.mark.slow
def test_docs_oneshot_report_example():
  """The guide's report example (a ```python block: the page has one code cell) prints the
  table shown under it: the convolution, then the scan's slices in the order it runs
  them, each at 2:4 (the errors to float32 rounding)."""
  with open(os.path.join(DOCS, 'guides/oneshot.md')) as f:
    section = f.read().split('**The report.**', 1)[1]
  code = re.search(r'```python\n(.*?)```', section, flags=re.DOTALL).group(1)
  shown = re.search(r'```text\n(.*?)```', section, flags=re.DOTALL).group(1).splitlines()
  out = io.StringIO()
  with contextlib.redirect_stdout(out), warnings.catch_warnings():
    warnings.simplefilter('error')  # nothing here is left dense unsaid
    exec(compile(code, 'docs/guides/oneshot.md', 'exec'), {})
  printed = out.getvalue().strip().splitlines()
  assert printed[0] == shown[0] == '(4, 32, 64) 0.5'
  names = ['conv/kernel'] + [f'blocks/{n}/kernel[{i}]' for i in range(4) for n in ('up', 'down')]
  assert [line.split()[0] for line in printed[2:]] == names
  assert len(printed) == len(shown)
  for got, want in zip(printed[1:], shown[1:], strict=True):
    assert got.split()[:-1] == want.split()[:-1]
    if got.split()[-1] != 'error':
      assert abs(float(got.split()[-1]) - float(want.split()[-1])) <= 2e-4
