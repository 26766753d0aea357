"""Executes colabs/quickstart.ipynb with the current Python's kernel."""

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'colabs', 'quickstart.ipynb'
)


def _text(cell):
  return ''.join(out.get('text', '') for out in cell.get('outputs', []))


def test_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == 'code':
      assert cell.outputs == [] and cell.execution_count is None


def test_notebook_runs(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(
    nb, timeout=120, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}
  ).execute()
  code = [cell for cell in nb.cells if cell.cell_type == 'code']
  # The install cell finds jaxprune installed and does nothing.
  assert code[0].outputs == []
  lines = _text(code[4]).splitlines()
  summaries = dict(line.split() for line in lines[1:])
  # threshold_method=exact keeps round(N * (1 - s)) weights: the two hidden
  # kernels end at 90%, the output layer at its own 50% target.
  assert summaries['Dense_0/kernel/sparsity'] == '0.9000'
  assert summaries['Dense_1/kernel/sparsity'] == '0.9000'
  assert summaries['Dense_2/kernel/sparsity'] == '0.5000'
  assert summaries['model_pruning/sparsity'] == '0.9000'
  # 'test accuracy: dense at step 100 0.955, pruned 0.960'
  words = lines[0].replace(',', '').split()
  dense, pruned = float(words[-3]), float(words[-1])
  assert dense > 0.9 and pruned > 0.9
  zeros = _text(code[5]).splitlines()
  assert zeros == [
    'Dense_0/kernel  zeros: 0.900',
    'Dense_1/kernel  zeros: 0.900',
    'Dense_2/kernel  zeros: 0.500',
  ]
  assert any(out.get('data', {}).get('image/png') for out in code[6].outputs)
  assert "title='Sparsity of each pruned kernel over training'" in code[6].source


def test_notebook_installs_what_it_imports():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  install = nb.cells[1].source
  assert nb.cells[1].cell_type == 'code' and "'-e', f'{root}[examples]'" in install
  assert "find_spec('jaxprune') is None or importlib.util.find_spec('sklearn') is None" in install
