"""How far a pruned model is from the dense model it came from, on real inputs.

The exactness check (`verify`) compares the pruned model with the *masked* model, the
dense model with the removed channels zeroed: it passes whenever the channels were cut
out correctly, however much removing them changed what the model computes. This module
measures that change, against the dense model itself:

    relative output error   ||pruned - dense|| / ||dense|| of each output (the largest)
    top-1 agreement         how often the largest logit is the same one, for an output
                            shaped like a classifier's logits: (batch, classes) or
                            (batch, positions, vocabulary)

A large change is expected after one-shot pruning, and is what fine-tuning or BatchNorm
re-calibration repairs (docs/guides/structured.md#after-pruning-fine-tune-or-recalibrate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# A change is large when the outputs move by more than a tenth of their size or more than
# 1 in 20 top-1 predictions change. One-shot L2 pruning of a CNN trained on scikit-learn's
# digits (tests/structured_dense_distance_test.py) is past both at 10% of its channels.
LARGE_REL_ERROR = 0.1
LOW_AGREEMENT = 0.95
# Calibration batches the distance is measured on (the first ones).
MAX_BATCHES = 8
WHAT_TO_DO = (
  'fine-tuning or recalibration is expected: train the pruned model a few hundred steps '
  '(result.pruned_fn is differentiable; '
  'docs/guides/structured.md#after-pruning-fine-tune-or-recalibrate), '
  'and re-estimate BatchNorm statistics with Calibration(batches, recalibrate_bn=True)'
)
# The same for a model without BatchNorm: there are no statistics to re-estimate.
FINE_TUNE = (
  'fine-tuning is expected: train the pruned model a few hundred steps '
  '(result.pruned_fn is differentiable; '
  'docs/guides/structured.md#after-pruning-fine-tune-or-recalibrate)'
)


@dataclasses.dataclass(frozen=True)
class DenseDistance:
  """How far the pruned model's outputs are from the dense model's (not the masked one).

  Attributes:
    rel_error: the largest, over the float outputs of the same shape in both models,
      of `||pruned - dense|| / ||dense||` (Inf where an output is NaN or Inf; NaN when
      there is no output to compare, which is not `large`).
    agreement: the fraction of rows (and positions) whose largest logit is the same
      in both models, for a first output shaped like logits (`(batch, classes)` or
      `(batch, positions, vocabulary)`); None otherwise.
    examples: the examples compared (rows of the first output).
    inputs: what they were: 'the example inputs' or 'N calibration batches'.
    batch_norm: whether the model has BatchNorm statistics, which re-calibration
      re-estimates (advised only then).
  """

  rel_error: float
  agreement: float | None
  examples: int
  inputs: str
  batch_norm: bool = True

  @property
  def large(self) -> bool:
    """The change is one that fine-tuning or re-calibration is expected to repair."""
    low = self.agreement is not None and self.agreement < LOW_AGREEMENT
    return low or self.rel_error > LARGE_REL_ERROR  # NaN (nothing compared) is not large

  def measured(self) -> str:
    """'top-1 agreement 19.3%, relative output error 0.84'."""
    parts = [] if self.agreement is None else [f'top-1 agreement {self.agreement:.1%}']
    if math.isnan(self.rel_error):
      parts.append('no float output of the same shape in both to compare')
    else:
      parts.append(f'relative output error {self.rel_error:.2g}')
    return ', '.join(parts)

  def line(self) -> str:
    """The summary's line: what was compared, on what, and what to do when it is large."""
    text = f'vs the dense model on {self.inputs} ({self.examples:,} examples): {self.measured()}'
    advice = WHAT_TO_DO if self.batch_norm else FINE_TUNE
    return f'{text}; a large change: {advice}.' if self.large else text


def _is_float(x: Any) -> bool:
  # jnp's issubdtype: numpy's says bfloat16 and the float8 types are not floating.
  return jnp.issubdtype(np.asarray(x).dtype, jnp.floating)


def _logits_like(x: Any) -> bool:
  return _is_float(x) and np.ndim(x) in (2, 3) and np.shape(x)[-1] > 1


def has_batch_norm(variables: Any) -> bool:
  """Whether variables hold BatchNorm statistics: a leaf under `batch_stats` (Linen) or
  named for a batch norm (haiku, a plain function's own tree)."""
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(variables)[0]]
  names = [jax.tree_util.keystr(path).lower().replace('_', '') for path in paths]
  return any('batchstats' in name or 'batchnorm' in name for name in names)


def distance(
  dense_outputs: Sequence[Any],
  pruned_outputs: Sequence[Any],
  inputs: str,
  *,
  batch_norm: bool = True,
) -> DenseDistance:
  """The `DenseDistance` of the pruned model's outputs from the dense model's.

  Args:
    dense_outputs: the dense model's output pytree, one per input set.
    pruned_outputs: the pruned model's, on the same inputs.
    inputs: what the inputs were, for the report.
    batch_norm: whether the model has BatchNorm statistics (see `has_batch_norm`): the
      advice for a large change names their re-calibration only then.

  Returns:
    A `DenseDistance`. Outputs whose shapes differ between the models (state tied to
    pruned channels, such as updated BatchNorm statistics) are not compared.
  """
  squared: dict[int, list[float]] = {}
  agree, positions, examples, logits = 0, 0, 0, True
  for dense, pruned in zip(dense_outputs, pruned_outputs, strict=True):
    dense_leaves, pruned_leaves = jax.tree.leaves(dense), jax.tree.leaves(pruned)
    for i, (d, p) in enumerate(zip(dense_leaves, pruned_leaves, strict=True)):
      d, p = np.asarray(d), np.asarray(p)
      if d.shape != p.shape or not _is_float(d):
        continue
      d, p = d.astype(np.float64), p.astype(np.float64)
      sums = squared.setdefault(i, [0.0, 0.0])
      sums[0] += float(np.sum((p - d) ** 2))
      sums[1] += float(np.sum(d**2))
    first = (dense_leaves or [None])[0], (pruned_leaves or [None])[0]
    logits = logits and all(x is not None and _logits_like(x) for x in first)
    if first[0] is not None and np.ndim(first[0]):
      examples += int(np.shape(first[0])[0])
    if logits and np.shape(first[0]) == np.shape(first[1]):
      top = [np.argmax(np.asarray(x, np.float32), -1) for x in first]
      agree += int(np.sum(top[0] == top[1]))
      positions += int(np.prod(np.shape(first[0])[:-1]))
  errors = [  # NaN or Inf outputs: an infinite error
    math.sqrt(diff / norm)
    if norm and math.isfinite(diff / norm)
    else (0.0 if diff == 0 else math.inf)
    for diff, norm in squared.values()
  ]
  return DenseDistance(
    max(errors) if errors else math.nan,
    agree / positions if logits and positions else None,
    examples,
    inputs,
    batch_norm,
  )


def input_sets(
  example_args: tuple, batches: Sequence[Any] | None, inputs: Callable[[Any], tuple]
) -> tuple[list[tuple], str]:
  """The inputs the distance is measured on, and their description: the first
  `MAX_BATCHES` calibration batches when there are any, else the example inputs."""
  if not batches:
    return [tuple(example_args)], 'the example inputs'
  chosen = list(batches[:MAX_BATCHES])
  return [tuple(inputs(b)) for b in chosen], f'{len(chosen)} calibration batch' + (
    'es' if len(chosen) > 1 else ''
  )
