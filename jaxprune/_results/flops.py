"""The FLOPs convention of every result: the fraction kept, and how it prints.

`jaxprune.structured.PruneResult`, `jaxprune.channels.Shrunk` and the main
job's channel report all hold the dense model's FLOPs (`flops_before`) and
the pruned model's (`flops_after`); they report the fraction kept and print
it one way, from here. It lives in the core, which imports nothing heavy, so
the main job reports it without loading `jaxprune.structured`.
"""

from __future__ import annotations


def flops_kept(before: float, after: float) -> float:
  """FLOPs after pruning as a fraction of before (1.0 when there were none)."""
  return after / before if before else 1.0


def flops_text(kept: float) -> str:
  """`'29.2% kept, 3.42x fewer'` for `kept=0.292`."""
  fewer = f'{1 / kept:.2f}x fewer' if kept > 0 else 'no FLOPs left'
  return f'{kept:.1%} kept, {fewer}'


class FlopsReport:
  """The FLOPs part of a result (`PruneResult`, `channels.Shrunk`): the one convention.

  A result with `flops_before` (the dense model's FLOPs per call) and
  `flops_after` (the pruned model's) reports `flops_kept`, their fraction, and
  prints it as `FLOPs 1.2e+09 -> 3.5e+08 (29.2% kept, 3.42x fewer)`.
  """

  flops_before: float
  flops_after: float

  @property
  def flops_kept(self) -> float:
    """FLOPs of the pruned model as a fraction of the dense model's (0.25: 4x fewer)."""
    return flops_kept(self.flops_before, self.flops_after)

  def flops_line(self) -> str:
    return (
      f'FLOPs {self.flops_before:.3g} -> {self.flops_after:.3g} ({flops_text(self.flops_kept)})'
    )
