"""What one-shot pruning did, layer by layer: `oneshot.prune_with_report`'s third result."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class LayerReport:
  """One pruned layer.

  Attributes:
    name: the layer's name (`Layer.name`: e.g. 'block_0/up/kernel', or
      'blocks/up/kernel[2]' for slice 2 of a stacked leaf).
    shape: its weight as a matrix, (outputs, inputs).
    target: '50%' for an unstructured target, '2:4' for an N:M pattern.
    sparsity: the share of its weights now zero by the mask.
    wave: its position in the sequential order (`Layer.wave`).
    error: `||W X - W' X||^2 / ||W X||^2` over the calibration inputs `X` the
      layer was pruned from, `W` its weights before, `W'` after (what SparseGPT's
      and Wanda's scripts print per layer, made relative); NaN when its output
      is zero on all of them.
    outliers: with `owl=`, OWL's outlier ratio of the layer (the share of its Wanda scores
      above `m` times their mean) on the dense model, from which its sparsity was set;
      None otherwise.
  """

  name: str
  shape: tuple[int, int]
  target: str
  sparsity: float
  wave: int
  error: float
  outliers: float | None = None


@dataclasses.dataclass(frozen=True)
class Report:
  """The pruned layers in the order they were pruned, and the weights left dense.

  Attributes:
    layers: a `LayerReport` per pruned layer.
    skipped: `(name, reason)` of each weight the methods cannot prune (a leaf
      with two axes longer than 1 that is not a layer), as `prune` warns.
    short: `(name, sparsity, target)` of each layer whose zeros are not the
      `round(target * size)` its target asks, as `prune` warns; empty when every layer
      reached its target.
    permutations: with `permute=`, a `oneshot.Permutation` per channel group reordered
      (the layers reading it, the weights reordered, the N:M kept score before and after).
  """

  layers: tuple[LayerReport, ...]
  skipped: tuple[tuple[str, str], ...]
  short: tuple[tuple[str, float, str], ...] = ()
  permutations: tuple[Any, ...] = ()

  def __str__(self) -> str:
    """A table: one line per layer (name, shape, target, sparsity, error, and OWL's outlier
    ratio where it set the sparsities), then the
    weights left dense and why, and the layers short of their target."""
    width = max([len(layer.name) for layer in self.layers] + [5])
    owl = any(layer.outliers is not None for layer in self.layers)
    lines = [
      f'{"layer":<{width}}  {"outputs x inputs":>16}  target  sparsity  rel. error'
      + ('  outliers' if owl else '')
    ]
    for layer in self.layers:
      shape = f'{layer.shape[0]} x {layer.shape[1]}'
      outliers = '' if layer.outliers is None else f'{layer.outliers:>8.3%}'
      lines.append(
        f'{layer.name:<{width}}  {shape:>16}  {layer.target:>6}  '
        f'{layer.sparsity:>8.1%}  {layer.error:>10.4f}' + (f'  {outliers:>8}' if owl else '')
      )
    lines += [f'left dense: {name} ({reason})' for name, reason in self.skipped]
    lines += [
      f'short of target: {name} {sparsity:.1%} (target {target})'
      for name, sparsity, target in self.short
    ]
    lines += [
      f'permuted the inputs of {", ".join(p.layers)}: N:M kept score {p.kept_before:.4g} -> '
      f'{p.kept_after:.4g}'
      for p in self.permutations
    ]
    return '\n'.join(lines)


def short_message(short: list[tuple[str, float, str]]) -> str:
  """The warning for layers a method left off their target sparsity."""
  each = ', '.join(f'{name} {sparsity:.1%} (target {target})' for name, sparsity, target in short)
  return (
    f'oneshot.prune: these layers did not reach their target sparsity: {each}. Their '
    "weights are as pruned; prune_with_report's report lists them."
  )
