"""One call for the common case: prune a Flax model to a ratio or a FLOPs target.

    result = jaxprune.structured.prune(model, x, variables=variables, ratio=0.5)  # Linen
    result = jaxprune.structured.prune(nnx_model, x, flops_target=0.3)            # NNX, in place

It traces the model, scores channels (optionally with Taylor importance on
calibration batches), selects, shrinks, checks the result against the dense
model with the removed channels zeroed, and optionally re-estimates the
BatchNorm statistics, with a progress bar for the calibration passes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flax import nnx

from jaxprune.structured import calibrate, cost, flax_rebuild, selectors
from jaxprune.structured import importance as importance_lib
from jaxprune.structured.oracle import VerifyReport, verify
from jaxprune.structured.plan import Constraint, Plan, make_plan
from jaxprune.structured.shrink import apply_plan
from jaxprune.structured.trace import trace

PyTree = Any


@dataclasses.dataclass
class PruneResult:
  """What `prune` hands back.

  Attributes:
    model: the Linen module (run it with `result.apply`) or the NNX model,
      pruned in place.
    variables: the pruned variables (Linen) or the NNX model's new state.
    plan: the channels removed.
    graph: the DependencyGraph of the dense model.
    pruned_fn: `pruned_fn(variables, *args)`, the traced function at the new
      shapes (exportable with `jax.export`).
    flops_before: dot_general + conv FLOPs per call of the dense model.
    flops_after: the same for the pruned model.
    check: the `verify` report on the example inputs (None when skipped).
  """
  model: Any
  variables: PyTree
  plan: Plan
  graph: Any
  pruned_fn: Callable
  flops_before: float
  flops_after: float
  check: VerifyReport | None

  def apply(self, variables: PyTree, *args: Any, **kwargs: Any) -> Any:
    """Runs a pruned Linen module (`model.apply` at the sizes of `variables`)."""
    with flax_rebuild.linen_resized(variables):
      return self.model.apply(variables, *args, **kwargs)

  def summary(self) -> str:
    ratio = self.flops_after / self.flops_before if self.flops_before else 1.0
    return (f'{self.plan.summary()}\nFLOPs {self.flops_before:.3g} -> {self.flops_after:.3g} '
            f'({ratio:.1%}, {1 / max(ratio, 1e-12):.2f}x fewer)')


def _default_inputs(batch: Any) -> tuple:
  return tuple(batch[:1]) if isinstance(batch, (tuple, list)) else (batch,)


def _finish(model, graph, variables, plan, new_variables, pruned_fn, example_args, check):
  report = verify(graph, variables, plan, *example_args, pruned_fn=pruned_fn) if check else None
  if report is not None and not report.ok:
    raise RuntimeError(f'prune: the pruned model differs from the dense model with the removed '
                       f'channels zeroed by {report.max_abs_diff:.3g}; please report this model.')
  return PruneResult(model, new_variables, plan, graph, pruned_fn,
                     cost.plan_flops(graph, make_plan(graph, {})), cost.plan_flops(graph, plan),
                     report)


def _scores(graph, variables, method, fn, loss_fn, batches, inputs, progress, masks, seed):
  if method != 'taylor':
    return importance_lib.score_channels(graph, variables, method, masks=masks, seed=seed)
  if loss_fn is None or batches is None:
    raise ValueError("importance='taylor': pass loss_fn(outputs, batch) and "
                     'calibration_batches.')
  loss = lambda v, batch: loss_fn(fn(v, *inputs(batch)), batch)
  return importance_lib.taylor_importance(graph, variables, loss, batches, progress)


def prune(model: Any, *example_args: Any, variables: PyTree | None = None,
          ratio: float | None = None, flops_target: float | None = None,
          importance: str | Mapping[int, Any] = 'l2', scope: str = 'uniform',
          search: str = 'greedy', constraint: Constraint | None = None,
          loss_fn: Callable[[Any, Any], Any] | None = None,
          calibration_batches: Iterable[Any] | None = None,
          inputs: Callable[[Any], tuple] = _default_inputs, recalibrate_bn: bool = False,
          apply_kwargs: Mapping[str, Any] | None = None,
          train_kwargs: Mapping[str, Any] | None = None, train_model: Any = None,
          masks: PyTree | None = None,
          seed: int = 0, check: bool = True, progress: bool = True) -> PruneResult:
  """Prunes a Flax Linen or NNX model to a ratio or a FLOPs target.

  Args:
    model: a Linen module (give `variables`) or an NNX module (pruned in
      place; put it in eval mode first so BatchNorm uses running statistics).
    *example_args: example inputs; the model is traced at these shapes.
    variables: the Linen variables.
    ratio: fraction of channels to remove (per group, or overall with
      `scope='global'`).
    flops_target: fraction of the dense FLOPs to keep instead.
    importance: 'l1', 'l2', 'bn_scale', 'density', 'random', 'taylor' (needs
      `loss_fn` and `calibration_batches`) or `{group id: scores}`.
    scope: 'uniform' or 'global' for `ratio`.
    search: 'greedy' or 'knapsack' for `flops_target`.
    constraint: a `Constraint` (min channels, round_to, locked regexes).
    loss_fn: `loss_fn(model_outputs, batch) -> scalar` for Taylor importance.
    calibration_batches: a re-iterable of batches (a list) for Taylor
      importance and BatchNorm re-calibration.
    inputs: maps a batch to the model's positional inputs (default: first
      element of a tuple batch, or the batch itself).
    recalibrate_bn: re-estimate BatchNorm statistics on the calibration batches.
    apply_kwargs: keyword arguments for Linen `model.apply` when tracing.
    train_kwargs: Linen keyword arguments that put BatchNorm in train mode
      for re-calibration (default `{'train': True}`; `{}` when the mode is an
      attribute, see `train_model`).
    train_model: the Linen module in train mode when the mode is a module
      attribute (e.g. `CNN(train=True)`); default `model`.
    masks: masks for `importance='density'`.
    seed: seed for `importance='random'`.
    check: verify the result against the zeroed dense model on the example
      inputs (raises if they differ).
    progress: tqdm progress bars for the calibration passes.

  Returns:
    A `PruneResult`.
  """
  is_nnx = isinstance(model, nnx.Module)
  if is_nnx == (variables is not None):
    raise ValueError('prune: pass variables=... for a Linen module and not for an NNX module '
                     f'(got a {type(model).__name__} and variables={type(variables).__name__}).')
  if (importance == 'taylor' or recalibrate_bn) and calibration_batches is not None:
    calibration_batches = list(calibration_batches)
  if is_nnx:
    graphdef, variables = nnx.split(model)
    fn = lambda state, *args: nnx.merge(graphdef, state)(*args)
  else:
    fn = functools.partial(model.apply, **dict(apply_kwargs or {}))
  graph = trace(fn, variables, *example_args)
  scores = _scores(graph, variables, importance, fn, loss_fn, calibration_batches, inputs,
                   progress, masks, seed)
  plan = selectors.select(graph, variables, ratio=ratio, flops_target=flops_target,
                          importance=scores, scope=scope, search=search, constraint=constraint)
  new_variables, pruned_fn = apply_plan(graph, variables, plan)
  result = _finish(model, graph, variables, plan, new_variables, pruned_fn, example_args, check)
  if is_nnx:
    flax_rebuild.update_nnx(model, new_variables)
  if recalibrate_bn:
    if not calibration_batches:
      raise ValueError('recalibrate_bn=True needs calibration_batches.')
    if is_nnx:
      calibrate.recalibrate_nnx(model, calibration_batches, inputs, progress)
      result.variables = nnx.state(model)
    elif 'batch_stats' in new_variables:
      kwargs = {'train': True} if train_kwargs is None else dict(train_kwargs)
      update = calibrate.linen_update_fn(train_model or model, new_variables, inputs=inputs,
                                         **kwargs)

      def resized_update(stats, batch):
        with flax_rebuild.linen_resized(new_variables):
          return update(stats, batch)

      stats = calibrate.recalibrate(resized_update, new_variables['batch_stats'],
                                    calibration_batches, progress)
      result.variables = {**new_variables, 'batch_stats': stats}
  return result
