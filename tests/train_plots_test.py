"""Tests for jaxprune_train._plots: PNGs are written headless."""

import matplotlib.image

from jaxprune_train import _plots as plots
from jaxprune_train._report import LeafReport


def test_plots_are_pngs(tmp_path):
  history = [
    {
      'step': s,
      'loss': 1.0 / s,
      'accuracy': 0.5,
      'target_sparsity': s / 100,
      'achieved_sparsity': s / 110,
    }
    for s in range(10, 100, 10)
  ]
  history += [{'step': 50, 'dense_test_accuracy': 0.9}, {'step': 90, 'test_accuracy': 0.88}]
  leaves = [LeafReport('Dense_0/kernel', (4, 5), 2, 0.9, 0.9, 0.1)]
  paths = plots.save_plots(str(tmp_path), history, leaves)
  assert [p.rsplit('/', 1)[1] for p in paths] == [
    'sparsity.png',
    'accuracy.png',
    'layer_sparsity.png',
  ]
  for path in paths:
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    height, width, _ = matplotlib.image.imread(path).shape
    assert height > 100 and width > 100


def test_no_layer_plot_without_pruned_leaves(tmp_path):
  paths = plots.save_plots(str(tmp_path), [{'step': 1, 'accuracy': 0.5}], [])
  assert len(paths) == 2


def test_importing_jaxprune_train_leaves_the_matplotlib_backend_alone():
  import subprocess
  import sys

  code = (
    'import sys, jaxprune_train, jaxprune_train._plots; print("matplotlib.pyplot" in sys.modules)'
  )
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == 'False'


def test_each_plot_has_a_title(tmp_path):
  history = [
    {
      'step': 10,
      'accuracy': 0.5,
      'target_sparsity': 0.1,
      'achieved_sparsity': 0.1,
      'test_accuracy': 0.4,
    }
  ]
  leaves = [LeafReport('Dense_0/kernel', (4, 5), 2, 0.9, 0.9, 0.1)]
  titles = [
    fig.axes[0].get_title()
    for fig in (
      plots.plot_sparsity(history, str(tmp_path / 's.png')),
      plots.plot_accuracy(history, str(tmp_path / 'a.png')),
      plots.plot_layer_sparsity(leaves, str(tmp_path / 'l.png')),
    )
  ]
  assert titles == [
    'Sparsity of the pruned leaves over training',
    'Accuracy over training',
    'Final sparsity per pruned leaf',
  ]
  assert sorted(p.name for p in tmp_path.iterdir()) == ['a.png', 'l.png', 's.png']
