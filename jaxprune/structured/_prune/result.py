"""What `prune` hands back: the pruned model and variables, the plan, the FLOPs and both checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxprune._results.flops import FlopsReport
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.plan import Plan
from jaxprune.structured._prune import models
from jaxprune.structured._prune.distance import DenseDistance
from jaxprune.structured._shrink import flax_rebuild
from jaxprune.structured._shrink.verify import VerifyReport

PyTree = Any


@dataclasses.dataclass
class PruneResult(FlopsReport):
  """What `prune` hands back.

  Attributes:
    model: for a Linen module, the module wrapped so that
      `result.model.apply(result.variables, x)` runs it at the pruned sizes
      (`result.apply` too; `result.model.module` is the module itself); the NNX
      model, pruned in place; or for a plain function the pruned callable
      (`result.model(result.variables, x)`).
    variables: the pruned variables (Linen) or the NNX model's new state.
    plan: the channels removed.
    graph: the DependencyGraph of the dense model.
    pruned_fn: `pruned_fn(variables, *args)`, the traced function at the new
      shapes; runs at any input shape and exports with `jax.export`.
    flops_before: dot_general + conv FLOPs per call of the dense model.
    flops_after: the same for the pruned model.
    check: the exactness check of `pruned_fn` on the example inputs against the
      masked model, the dense model with the removed channels zeroed (`verify`'s
      report; None when skipped). It says the channels were cut out correctly,
      not that the model still computes what the dense one did: see
      `dense_distance`.
    model_check: the same check of what users run: `result.apply` (Linen,
      under `linen_resized`) or the pruned NNX model itself (for a plain
      function, `check` again: its users run the pruned callable).
    dense_distance: how far the pruned model (after any BatchNorm
      re-calibration) is from the dense model: relative output error and, for
      logits, top-1 agreement, on the calibration batches (the first 8) or else
      the example inputs (None when `check=False`). When `.large`, fine-tuning
      or re-calibration is expected.
    shortfall: None when the plan removes what `ratio` or `flops_target` asked
      for; else what was asked, what was removed and why (`plan.shortfall`;
      e.g. no prunable group). `complete` is False then; `repr` starts with
      it, `summary()` has a line for it, and both checks carry it.
  """

  model: Any
  variables: PyTree
  plan: Plan
  graph: DependencyGraph
  pruned_fn: Callable
  flops_before: float
  flops_after: float
  check: VerifyReport | None
  model_check: VerifyReport | None = None
  dense_distance: DenseDistance | None = None
  shortfall: str | None = None

  @property
  def complete(self) -> bool:
    """The prune removed what its target asked for (`shortfall` is None)."""
    return self.shortfall is None

  def apply(self, variables: PyTree, *args: Any, **kwargs: Any) -> Any:
    """Runs a pruned Linen module (`model.apply` at the sizes of `variables`)."""
    model = getattr(self.model, 'module', self.model)
    with flax_rebuild.linen_resized(variables), models.explained('result.apply'):
      return model.apply(variables, *args, **kwargs)

  def __repr__(self) -> str:
    """One line: what was pruned, the FLOPs, both checks (the fields hold whole models)."""
    sizes = [getattr(x, 'size', 0) for x in jax.tree.leaves(self.variables)]
    check = (
      'not checked (check=False)'
      if self.check is None
      else (
        'equals the masked model (dense, removed channels zeroed) to '
        f'{self.check.max_rel_diff:.2g} of the output scale'
      )
    )
    dense = self.dense_distance
    if dense is not None:
      check += f', vs the dense model: {dense.measured()}'
      advice = 'fine-tune or recalibrate' if dense.batch_norm else 'fine-tune'
      check += f' (a large change: {advice})' if dense.large else ''
    short = '' if self.shortfall is None else f'SHORT OF THE TARGET: {self.shortfall}; '
    return (
      f'PruneResult({short}channels removed from {len(self.plan.removed)} of '
      f'{len(self.graph.channel_groups)} channel groups, {sum(sizes):,} values left in '
      f'{len(sizes)} arrays, {self.flops_line()}, {check}; see .summary(), .model, '
      '.variables, .pruned_fn)'
    )

  def summary(self) -> str:
    """The plan's summary, the FLOPs line (`FlopsReport`), then both checks: against the
    masked model (exactness) and against the dense model (the change pruning made)."""
    if self.check is None:
      exact = 'not run (check=False)'
    else:
      verdict = 'passed' if self.check.ok else 'FAILED'
      exact = f'{verdict}, largest difference {self.check.max_rel_diff:.2g} of the output scale'
    lines = [
      self.plan.summary(self.graph),
      self.flops_line(),
      f'exactness check against the masked model (the dense model with the removed '
      f'channels zeroed): {exact}',
    ]
    if self.dense_distance is not None:
      lines.append(self.dense_distance.line())
    return '\n'.join(lines)  # the plan's summary already names any shortfall
