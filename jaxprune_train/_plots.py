"""PNG plots of a run: sparsity and accuracy over steps, final sparsity per leaf, and a
language model's bits per byte over steps.

Figures are drawn on their own Agg canvas, never through pyplot: no display
is needed, and a notebook that imports jaxprune keeps its own backend. Each
PNG replaces the old one atomically.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jaxprune_train import _files as files
from jaxprune_train._report import LeafReport

SPARSITY_PNG = 'sparsity.png'
ACCURACY_PNG = 'accuracy.png'
LAYERS_PNG = 'layer_sparsity.png'
BITS_PNG = 'bits_per_byte.png'


def _figure(width: float, height: float) -> tuple[Figure, Any]:
  fig = Figure(figsize=(width, height))
  FigureCanvasAgg(fig)
  return fig, fig.add_subplot()


def _save(fig: Figure, path: str, **options: Any) -> None:
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=100, **options)
  files.atomic_write(path, buffer.getvalue())


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list, list]:
  points = [(r['step'], r[key]) for r in history if key in r]
  return [p[0] for p in points], [p[1] for p in points]


def plot_sparsity(history: Sequence[Mapping[str, Any]], path: str) -> Figure:
  """Plots target and achieved sparsity over training steps to `path`; returns the figure."""
  fig, ax = _figure(6, 4)
  ax.plot(*_series(history, 'target_sparsity'), label='target (schedule)')
  ax.plot(*_series(history, 'achieved_sparsity'), '--', label='achieved (all pruned leaves)')
  ax.set_xlabel('step')
  ax.set_ylabel('sparsity')
  ax.set_ylim(-0.02, 1.02)
  ax.set_title('Sparsity of the pruned leaves over training')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  _save(fig, path)
  return fig


def _train_and_held_out(
  history: Sequence[Mapping[str, Any]],
  path: str,
  metric: str,
  held_out: str,
  ylabel: str,
  title: str,
) -> Figure:
  """Plots `metric` on the train batches and `test_<metric>` on held-out data, the dense
  model's at the start of pruning starred; returns the figure."""
  fig, ax = _figure(6, 4)
  ax.plot(*_series(history, metric), alpha=0.5, label='train batch')
  ax.plot(*_series(history, f'test_{metric}'), 'o-', label=held_out)
  steps, dense = _series(history, f'dense_test_{metric}')
  if dense:
    ax.plot(steps, dense, 'k*', markersize=12, label=f'{held_out}, dense at start of pruning')
  ax.set_xlabel('step')
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  _save(fig, path)
  return fig


def plot_accuracy(history: Sequence[Mapping[str, Any]], path: str) -> Figure:
  """Plots train-batch and test accuracy (dense-at-start point starred); returns the figure."""
  return _train_and_held_out(
    history, path, 'accuracy', 'test', 'accuracy', 'Accuracy over training'
  )


def plot_bits_per_byte(history: Sequence[Mapping[str, Any]], path: str) -> Figure:
  """Plots a language model's train and held-out bits per byte over steps; returns the figure."""
  return _train_and_held_out(
    history, path, 'bits_per_byte', 'held-out', 'bits per byte', 'Next-byte loss over training'
  )


def plot_layer_sparsity(leaves: Sequence[LeafReport], path: str) -> Figure:
  """Plots the final sparsity per pruned leaf, target marked, to `path`; returns the figure."""
  fig, ax = _figure(6, 1.5 + 0.4 * max(len(leaves), 1))
  names = [leaf.name for leaf in leaves]
  ax.barh(names, [leaf.achieved for leaf in leaves], label='achieved')
  ax.plot([leaf.target for leaf in leaves], names, 'k|', markersize=20, label='target')
  ax.invert_yaxis()
  ax.set_xlim(0, 1)
  ax.set_xlabel('final sparsity')
  ax.set_title('Final sparsity per pruned leaf')
  ax.legend(loc='center left', bbox_to_anchor=(1.01, 0.5))
  _save(fig, path, bbox_inches='tight')
  return fig


def save_plots(
  workdir: str, history: Sequence[Mapping[str, Any]], leaves: Sequence[LeafReport]
) -> list[str]:
  """Writes the run's PNG plots into `workdir`.

  Args:
    workdir: output directory.
    history: the run's metric records (`metrics.jsonl`).
    leaves: the final per-leaf report (no layer plot when empty).

  Returns:
    The paths written.
  """
  paths = [os.path.join(workdir, SPARSITY_PNG), os.path.join(workdir, ACCURACY_PNG)]
  plot_sparsity(history, paths[0])
  plot_accuracy(history, paths[1])
  if leaves:
    paths.append(os.path.join(workdir, LAYERS_PNG))
    plot_layer_sparsity(leaves, paths[-1])
  if any('test_bits_per_byte' in record for record in history):
    paths.append(os.path.join(workdir, BITS_PNG))
    plot_bits_per_byte(history, paths[-1])
  return paths
