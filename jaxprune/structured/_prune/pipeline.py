"""One call for the common case: prune a Flax model to a ratio or a FLOPs target.

    result = jaxprune.structured.prune(model, x, variables=variables, ratio=0.5)  # Linen
    result = jaxprune.structured.prune(nnx_model, x, flops_target=0.3)            # NNX, in place

It traces the model, scores channels (optionally with Taylor importance on
calibration batches), selects, shrinks, checks the result against the dense
model with the removed channels zeroed, and optionally re-estimates the
BatchNorm statistics, with a progress bar for the calibration passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import flax
import flax.linen as nn
from flax import nnx

from jaxprune.structured._core import cost
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.plan import Constraint, Plan, make_plan
from jaxprune.structured._select import importance as importance_lib
from jaxprune.structured._select import selectors
from jaxprune.structured._shrink import calibrate, flax_rebuild
from jaxprune.structured._shrink.apply import apply_plan
from jaxprune.structured._shrink.verify import VerifyReport, compare, dense_reference, verify
from jaxprune.structured._trace.tracing import trace

PyTree = Any


@dataclasses.dataclass
class PruneResult(cost.FlopsReport):
  """What `prune` hands back.

  Attributes:
    model: the Linen module (run it with `result.apply`) or the NNX model,
      pruned in place.
    variables: the pruned variables (Linen) or the NNX model's new state.
    plan: the channels removed.
    graph: the DependencyGraph of the dense model.
    pruned_fn: `pruned_fn(variables, *args)`, the traced function at the new
      shapes; runs at any input shape and exports with `jax.export`.
    flops_before: dot_general + conv FLOPs per call of the dense model.
    flops_after: the same for the pruned model.
    check: the `verify` report of `pruned_fn` on the example inputs (None
      when skipped).
    model_check: the same check of what users run: `result.apply` (Linen,
      under `linen_resized`) or the pruned NNX model itself.
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

  def apply(self, variables: PyTree, *args: Any, **kwargs: Any) -> Any:
    """Runs a pruned Linen module (`model.apply` at the sizes of `variables`)."""
    with flax_rebuild.linen_resized(variables), _explained('result.apply'):
      return self.model.apply(variables, *args, **kwargs)

  def summary(self) -> str:
    """The plan's summary, then the FLOPs line (`FlopsReport`)."""
    return f'{self.plan.summary()}\n{self.flops_line()}'


@contextlib.contextmanager
def _explained(what: str) -> Iterator[None]:
  """Re-raises a failure of the resized model with what happened and what runs instead."""
  try:
    yield
  except (flax.errors.FlaxError, TypeError, ValueError) as e:
    raise RuntimeError(
        f'prune: {what} fails on the pruned model ({type(e).__name__}: {str(e)[:300]}). '
        'The model\'s code most likely branches on shapes that pruning changed (e.g. '
        '`if x.shape[-1] != self.features: x = proj(x)`), so at the new sizes it takes another '
        'path than the one traced. The pruned callable runs the traced computation at the new '
        'sizes: prune(..., check=False) and call result.pruned_fn(result.variables, x) (it '
        'exports with jax.export), or keep that group whole with '
        'Constraint(locked=(...,)).') from e


def _default_inputs(batch: Any) -> tuple:
  return tuple(batch[:1]) if isinstance(batch, (tuple, list)) else (batch,)


def _check_arguments(model, example_args, variables, ratio, flops_target, importance, scope,
                     search, constraint, loss_fn, batches, inputs, recalibrate_bn,
                     apply_kwargs, norms) -> None:
  """Every check `prune` can make before it traces or changes anything."""
  is_nnx = isinstance(model, nnx.Module)
  if not is_nnx and not isinstance(model, nn.Module):
    raise TypeError(f'prune: model must be a Flax Linen or NNX module, got '
                    f'{type(model).__name__}; for other functions use trace, select and '
                    'apply_plan.')
  if is_nnx == (variables is not None):
    raise ValueError('prune: pass variables=... for a Linen module and not for an NNX module '
                     f'(got a {type(model).__name__} and variables={type(variables).__name__}).')
  if not example_args:
    raise ValueError('prune: give example inputs, prune(model, x, ...): the model is traced '
                     'at them.')
  selectors.check_target(ratio=ratio, flops_target=flops_target, scope=scope, search=search,
                         constraint=constraint)
  importance_lib.check_method(importance, extra=('taylor',))
  if importance == 'taylor' and (loss_fn is None or batches is None):
    raise ValueError("importance='taylor': pass loss_fn(outputs, batch) and "
                     'calibration_batches.')
  if loss_fn is not None and not callable(loss_fn):
    raise TypeError(f'loss_fn must be callable(outputs, batch) -> scalar, got {loss_fn!r}.')
  if recalibrate_bn and not batches:
    raise ValueError('recalibrate_bn=True needs calibration_batches (a list of batches).')
  if (importance == 'taylor' or recalibrate_bn) and not batches:
    raise ValueError('calibration_batches is empty; give at least one batch.')
  if not callable(inputs):
    raise TypeError(f'inputs must map a batch to the model inputs (a callable), got {inputs!r}.')
  if norms == 'exact':
    raise ValueError(
        "prune: norms='exact' keeps dividing each norm by the full width, which only the pruned "
        'callable of apply_plan does; the resized Flax model prune returns divides by the kept '
        "width. Pass norms='renormalise' with constraint=Constraint(allow_approximate=True) "
        "(checked within the approximate bound), or use trace(..., norms='exact'), select and "
        'apply_plan for the exact pruned callable.')
  if apply_kwargs is not None and not isinstance(apply_kwargs, Mapping):
    raise TypeError(f'apply_kwargs must be a dict of keyword arguments, got '
                    f'{type(apply_kwargs).__name__}.')


def _verified(graph, variables, plan, example_args, runs):
  """Verifies each `(what, fn)` in `runs` against the oracle; raises on a mismatch.

  A plan that cuts approximate groups is checked as `verify` does: the
  channel mapping exactly with the norms' statistics frozen, the outputs
  within the approximate bound.
  """
  approximate = any(graph.groups[gid].approximate for gid in plan.removed)
  reference = None if approximate else dense_reference(graph, variables, plan, *example_args)
  reports = []
  for what, fn in runs:
    if approximate:
      report = verify(graph, variables, plan, *example_args, pruned_fn=lambda _, *a, fn=fn: fn(*a))
    else:
      report = compare(reference, fn(*example_args))
    if not report.ok:
      raise RuntimeError(
          f'prune: {what} differs from the dense model with the removed channels zeroed '
          f'(largest difference {report.max_rel_diff:.3g} of the output scale); nothing was '
          'changed. Please report this model.')
    reports.append(report)
  return reports


def _scores(graph, variables, method, fn, loss_fn, batches, inputs, progress, masks, seed):
  if method != 'taylor':
    return importance_lib.score_channels(graph, variables, method, masks=masks, seed=seed)
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
          masks: PyTree | None = None, norms: str | None = None,
          seed: int = 0, check: bool = True, progress: bool = True) -> PruneResult:
  """Prunes a Flax Linen or NNX model to a ratio or a FLOPs target.

  Every argument is checked before anything is traced, and an NNX model is
  changed only once the pruned model has passed the check (and, if asked,
  been re-calibrated): a failure leaves it as it was.

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
    norms: None keeps the residual stream (width) whole; 'renormalise' lets it
      be pruned through LayerNorm/RMSNorm, each norm then dividing by the kept
      width as the resized Flax modules do. Such groups are approximate: give
      `Constraint(allow_approximate=True)` to select them. ('exact' is for
      `trace` and the pruned callable only.)
    seed: seed for `importance='random'`.
    check: verify the pruned callable and the pruned model itself
      (`result.apply`, or the NNX model) against the zeroed dense model on the
      example inputs; raises, changing nothing, if they differ.
    progress: tqdm progress bars for the calibration passes.

  Returns:
    A `PruneResult`.
  """
  if calibration_batches is not None:
    calibration_batches = list(calibration_batches)
  _check_arguments(model, example_args, variables, ratio, flops_target, importance, scope,
                   search, constraint, loss_fn, calibration_batches, inputs, recalibrate_bn,
                   apply_kwargs, norms)
  is_nnx = isinstance(model, nnx.Module)
  apply_kwargs = dict(apply_kwargs or {})
  if is_nnx:
    graphdef, variables = nnx.split(model)
    fn = lambda state, *args: nnx.merge(graphdef, state)(*args)
  else:
    fn = functools.partial(model.apply, **apply_kwargs)
  graph = trace(fn, variables, *example_args, norms=norms)
  scores = _scores(graph, variables, importance, fn, loss_fn, calibration_batches, inputs,
                   progress, masks, seed)
  plan = selectors.select(graph, variables, ratio=ratio, flops_target=flops_target,
                          importance=scores, scope=scope, search=search, constraint=constraint)
  new_variables, pruned_fn = apply_plan(graph, variables, plan)
  if is_nnx:
    pruned_model = flax_rebuild.update_nnx_attributes(nnx.merge(graphdef, new_variables))

    def run_model(*args):
      with _explained('the pruned NNX model'):
        return pruned_model(*args)
  else:
    def run_model(*args):
      with flax_rebuild.linen_resized(new_variables), _explained('result.apply'):
        return model.apply(new_variables, *args, **apply_kwargs)
  check_fn, model_check = None, None
  if check:
    check_fn, model_check = _verified(
        graph, variables, plan, example_args,
        [('the pruned callable', lambda *a: pruned_fn(new_variables, *a)),
         ('result.apply' if not is_nnx else 'the pruned NNX model', run_model)])
  flops = cost.plan_flops(graph, make_plan(graph, {})), cost.plan_flops(graph, plan)
  if recalibrate_bn:
    if is_nnx:
      calibrate.recalibrate_nnx(pruned_model, calibration_batches, inputs, progress)
    elif 'batch_stats' in new_variables:
      new_variables = _recalibrated_linen(model, train_model, train_kwargs, new_variables,
                                          calibration_batches, inputs, progress)
  if is_nnx:  # only now, with every check passed, is the user's model changed
    flax_rebuild.update_nnx(model, nnx.state(pruned_model))
    new_variables = nnx.state(model)
  return PruneResult(model, new_variables, plan, graph, pruned_fn, *flops, check_fn, model_check)


def _recalibrated_linen(model, train_model, train_kwargs, new_variables, batches, inputs,
                        progress):
  kwargs = {'train': True} if train_kwargs is None else dict(train_kwargs)
  update = calibrate.linen_update_fn(train_model or model, new_variables, inputs=inputs,
                                     **kwargs)

  def resized_update(stats, batch):
    with flax_rebuild.linen_resized(new_variables):
      return update(stats, batch)

  stats = calibrate.recalibrate(resized_update, new_variables['batch_stats'], batches, progress)
  return {**new_variables, 'batch_stats': stats}
