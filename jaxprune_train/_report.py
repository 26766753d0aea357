"""The end-of-run report: a table per pruned leaf and the run's totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class LeafReport(NamedTuple):
  """One pruned leaf at the end of a run.

  Attributes:
    name: the leaf's name, e.g. 'Dense_0/kernel'.
    shape: its shape.
    nonzero: number of nonzero entries.
    target: the leaf's final target sparsity (1 - n/m for an N:M leaf).
    achieved: fraction of its entries that are exactly zero.
    threshold: the magnitude threshold of its last mask update (None for N:M).
    block: the (height, width) of the blocks it is pruned in, -1 resolved.
    nm: (n, m) when it keeps n of every m weights, else None.
  """

  name: str
  shape: tuple[int, ...]
  nonzero: int
  target: float
  achieved: float
  threshold: float | None
  block: tuple[int, int] = (1, 1)
  nm: tuple[int, int] | None = None

  @property
  def pattern(self) -> str:
    """'2:4' for N:M, else the block shape, e.g. '4x4' ('1x1' for single weights)."""
    if self.nm is not None:
      return '{}:{}'.format(*self.nm)
    return 'x'.join(map(str, self.block))

  @property
  def size(self) -> int:
    """Number of entries."""
    size = 1
    for dim in self.shape:
      size *= dim
    return size


class RunReport(NamedTuple):
  """What a finished run prints and saves.

  Attributes:
    leaves: the pruned leaves, in the params' flattening order.
    total_params: number of entries in all params.
    total_nonzero: number of nonzero entries in all params.
    dense_accuracy: test accuracy when pruning began (None if never measured).
    dense_step: the step of `dense_accuracy`.
    final_accuracy: test accuracy at the end.
    final_step: the last step.
    global_target: with `global_pruning`, the target all pruned leaves share
      (one threshold across them), else None.
    channels: with channel pruning, the report's lines on the channel groups
      and the shrunk model (`jaxprune_train._channels.ChannelResult.lines`).
    bits_per_byte: a language model's final held-out loss in bits per byte
      (None for other models).
    dense_bits_per_byte: the same at `dense_step`, before pruning (None if not measured).
  """

  leaves: Sequence[LeafReport]
  total_params: int
  total_nonzero: int
  dense_accuracy: float | None
  dense_step: int | None
  final_accuracy: float
  final_step: int
  global_target: float | None = None
  channels: Sequence[str] = ()
  bits_per_byte: float | None = None
  dense_bits_per_byte: float | None = None


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

  def line(row: Sequence[str]) -> str:
    # The first column (names) reads best left-aligned, numbers right-aligned.
    cells = [row[0].ljust(widths[0])]
    cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
    return '  '.join(cells).rstrip()

  rule = '  '.join('-' * w for w in widths)
  return [line(header), rule, *[line(r) for r in rows[:-1]], rule, line(rows[-1])]


def format_report(report: RunReport) -> str:
  """Formats `report` as a plain-text table with totals and accuracies.

  Args:
    report: the run's report.

  Returns:
    Multi-line text, ready to print.
  """
  lines = []
  if report.leaves:
    rows = [
      [
        leaf.name,
        'x'.join(map(str, leaf.shape)),
        f'{leaf.size:,}',
        f'{leaf.nonzero:,}',
        f'{leaf.target:.3f}',
        f'{leaf.achieved:.3f}',
        '-' if leaf.threshold is None else f'{leaf.threshold:.4g}',
      ]
      for leaf in report.leaves
    ]
    size = sum(leaf.size for leaf in report.leaves)
    nonzero = sum(leaf.nonzero for leaf in report.leaves)
    target = sum(leaf.target * leaf.size for leaf in report.leaves) / size
    rows.append(
      [
        'all pruned leaves',
        '',
        f'{size:,}',
        f'{nonzero:,}',
        f'{target:.3f}',
        f'{1 - nonzero / size:.3f}',
        '',
      ]
    )
    header = ['leaf', 'shape', 'params', 'nonzero', 'target', 'achieved', 'threshold']
    if any(leaf.pattern != '1x1' for leaf in report.leaves):
      header.append('pattern')
      for row, leaf in zip(rows[:-1], report.leaves, strict=True):
        row.append(leaf.pattern)
      rows[-1].append('')
    lines += _table(header, rows)
    if report.global_target is not None:
      lines.append(
        f'global pruning: one threshold across the pruned leaves; the target '
        f'{report.global_target:.3f} holds for them together, not for each.'
      )
  elif not report.channels:
    lines.append('no pruned leaves')
  lines += report.channels
  sparse = 1 - report.total_nonzero / report.total_params
  lines.append(
    f'all params: {report.total_params:,}, nonzero: {report.total_nonzero:,} ({sparse:.1%} zero)'
  )
  final = f'final (step {report.final_step}) {report.final_accuracy:.2%}'
  if report.dense_accuracy is None:
    lines.append(f'test accuracy: {final}')
  else:
    change = 100 * (report.final_accuracy - report.dense_accuracy)
    lines.append(
      f'test accuracy: dense at start of pruning (step {report.dense_step}) '
      f'{report.dense_accuracy:.2%}, {final} ({change:+.2f} points)'
    )
  if report.bits_per_byte is not None:
    lines.append(_bits_line(report))
  return '\n'.join(lines)


def _bits_line(report: RunReport) -> str:
  final = f'final (step {report.final_step}) {report.bits_per_byte:.4f}'
  if report.dense_bits_per_byte is None:
    return f'held-out bits per byte: {final}'
  ratio = report.bits_per_byte / report.dense_bits_per_byte
  return (
    f'held-out bits per byte: dense at start of pruning (step {report.dense_step}) '
    f'{report.dense_bits_per_byte:.4f}, {final} ({ratio:.3f}x)'
  )
