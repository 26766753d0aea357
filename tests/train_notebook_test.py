"""Executes colabs/quickstart.ipynb with the current Python's kernel."""

import os

import nbformat
import pytest
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


@pytest.mark.slow
def test_notebook_runs(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(
    nb, timeout=120, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}
  ).execute()
  code = [cell for cell in nb.cells if cell.cell_type == 'code']
  lines = _text(code[3]).splitlines()
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
  zeros = _text(code[4]).splitlines()
  assert zeros == [
    'Dense_0/kernel  zeros: 0.900',
    'Dense_1/kernel  zeros: 0.900',
    'Dense_2/kernel  zeros: 0.500',
  ]
  assert any(out.get('data', {}).get('image/png') for out in code[5].outputs)


def test_notebook_opens_with_the_library_not_with_setup():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  first = next(cell for cell in nb.cells if cell.cell_type == 'code')
  assert 'import jaxprune' in first.source and 'subprocess' not in first.source
  assert 'pip install -e ".[examples]"' in nb.cells[0].source


def test_notebook_plot_shows_every_line_where_they_coincide():
  """Two kernels on the same schedule: each line is drawn narrower than those under it."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  nb = nbformat.read(NOTEBOOK, as_version=4)
  [cell] = [c for c in nb.cells if c.cell_type == 'code' and 'plt.subplots' in c.source]
  same = {f'Dense_{i}/kernel/sparsity': 0.9 for i in range(3)}
  history = [{'step': s, 'model_pruning/sparsity': 0.9, **same} for s in (20, 40)]
  scope = {'history': history, 'plt': plt}
  exec(cell.source.replace('plt.show()', ''), scope)  # noqa: S102 - the notebook's own code
  lines = scope['ax'].get_lines()
  assert len(lines) == 4
  widths = [line.get_linewidth() for line in lines]
  # The schedule, then the two kernels that follow it: each narrower than the one under it.
  assert widths[0] > widths[1] > widths[2], widths
  assert len({(line.get_linestyle(), line.get_linewidth()) for line in lines}) == 4
  legend = [text.get_text() for text in scope['ax'].get_legend().get_texts()]
  assert legend == [line.get_label() for line in lines]
