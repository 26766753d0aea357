"""One call for the common case: prune a model to a ratio or a FLOPs target.

    result = jaxprune.structured.prune(model, x, variables=variables, ratio=0.5)  # Linen
    result = jaxprune.structured.prune(nnx_model, x, flops_target=0.3)            # NNX, in place
    result = jaxprune.structured.prune(fn, x, variables=params, ratio=0.5)        # fn(params, x)
    result = jaxprune.structured.prune(                                           # Taylor scores
        model, x, variables=variables, ratio=0.5, importance='taylor',
        calibration=jaxprune.structured.Calibration(batches, loss_fn=loss))

It traces the model, scores channels (optionally with Taylor importance on
calibration batches), selects, shrinks, checks the result against the masked
model (the dense model with the removed channels zeroed), optionally
re-estimates the BatchNorm statistics, with a progress bar for the calibration
passes, and measures how far the result is from the dense model itself. One
path for every model; what differs between Linen, NNX and plain functions is
in the adapters of `models.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from jaxprune._names import named_leaves
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.plan import Constraint
from jaxprune.structured._primitives import cost
from jaxprune.structured._prune import distance, misuse, models, options
from jaxprune.structured._prune.options import Calibration, LinenOptions
from jaxprune.structured._prune.result import PruneResult
from jaxprune.structured._select import importance as importance_lib
from jaxprune.structured._select import selectors, targets
from jaxprune.structured._shrink.apply import apply_plan
from jaxprune.structured._shrink.verify import (
  checked_callable,
  compare,
  computation_rtol,
  dense_reference,
  full_precision,
  verify,
)
from jaxprune.structured._trace.tracing import trace

PyTree = Any


def _check_group(keyword: str, value: Any, cls: type) -> None:
  if value is not None and not isinstance(value, cls):
    raise TypeError(
      f'{keyword}: give a jaxprune.structured.{cls.__name__}, got {type(value).__name__}.'
    )


def _check_arguments(
  example_args,
  ratio,
  flops_target,
  importance,
  scope,
  search,
  constraint,
  calibration,
  linen,
  norms,
  masks,
) -> None:
  """Every check `prune` can make before it traces or changes anything (the model's own,
  in `models.adapter`, come first). `calibration.batches` is a list (or None) by now."""
  if not example_args:
    raise ValueError(
      'prune: give example inputs, prune(model, x, ...): the model is traced at them.'
    )
  targets.check_target(
    ratio=ratio, flops_target=flops_target, scope=scope, search=search, constraint=constraint
  )
  importance_lib.check_method(importance, extra=('taylor',))
  if masks is not None and importance != 'density':
    raise ValueError(
      f"prune: masks= is read only by importance='density' (importance={importance!r} here); "
      "pass importance='density', masks=jaxprune.get_masks(state), or drop masks."
    )
  loss_fn, batches = calibration.loss_fn, calibration.batches
  if importance == 'taylor' and (loss_fn is None or batches is None):
    raise ValueError(
      "importance='taylor': pass loss_fn(outputs, batch) and the batches, "
      'calibration=jaxprune.structured.Calibration(batches, loss_fn=...).'
    )
  if loss_fn is not None and not callable(loss_fn):
    raise TypeError(f'loss_fn must be callable(outputs, batch) -> scalar, got {loss_fn!r}.')
  if calibration.recalibrate_bn and not batches:
    raise ValueError(
      'recalibrate_bn=True needs calibration batches: '
      'Calibration(batches, recalibrate_bn=True) with a list of at least one batch.'
    )
  if importance == 'taylor' and not batches:
    raise ValueError('Calibration.batches is empty; give at least one batch.')
  if not callable(calibration.inputs):
    raise TypeError(
      f'inputs must map a batch to the model inputs (a callable), got {calibration.inputs!r}.'
    )
  if norms == 'exact':
    raise ValueError(
      "prune: norms='exact' keeps dividing each norm by the full width, which only the pruned "
      'callable of apply_plan does; the resized Flax model prune returns divides by the kept '
      "width. Pass norms='renormalise' with constraint=Constraint(allow_approximate=True) "
      "(checked within the approximate bound), or use trace(..., norms='exact'), select and "
      'apply_plan for the exact pruned callable.'
    )
  apply_kwargs = linen.apply_kwargs
  if apply_kwargs is not None and not isinstance(apply_kwargs, Mapping):
    raise TypeError(
      f'apply_kwargs must be a dict of keyword arguments, got {type(apply_kwargs).__name__}.'
    )


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
      with full_precision():
        outputs = fn(*example_args)
      report = compare(reference, outputs, rtol_floor=computation_rtol(graph))
    if not report.ok and reports:  # the pruned callable passed: the model's own code differs
      raise RuntimeError(
        f'prune: {what} differs from the dense model with the removed channels zeroed '
        f'(largest difference {report.max_rel_diff:.3g} of the output scale), while the '
        "pruned callable matches it; nothing was changed. The model's code computes "
        'something from a pruned size that the trace held as a constant (a rotary '
        "embedding's sin/cos table from the head size, a scale from the width): prune "
        'the function instead, prune(model.apply, variables, x), whose result runs the '
        'traced computation at the new sizes, or keep that group whole with '
        'Constraint(locked=(...,)).'
      )
    if not report.ok:
      raise RuntimeError(
        f'prune: {what} differs from the dense model with the removed channels zeroed '
        f'(largest difference {report.max_rel_diff:.3g} of the output scale); nothing was '
        'changed. Please report this model.'
      )
    reports.append(report)
  return reports


def _scores(graph, variables, method, fn, calibration, progress, masks, seed):
  if method != 'taylor':
    scores = importance_lib.score_channels(graph, variables, method, masks=masks, seed=seed)
    if method == 'density' and masks is None and _all_tied(graph, scores):
      raise ValueError(
        "prune: importance='density' ranks channels by their share of nonzero weights, and "
        'without masks= every channel of each group has the same share in these variables '
        '(nothing pruned yet), so the choice would be arbitrary; pass '
        'masks=jaxprune.get_masks(state), or the variables after unstructured pruning, or '
        "choose another importance ('l2')."
      )
    return scores
  loss = misuse.checked_loss(fn, calibration.loss_fn, calibration.inputs)
  return importance_lib.taylor_importance(graph, variables, loss, calibration.batches, progress)


def _all_tied(graph: DependencyGraph, scores: Mapping[int, Any]) -> bool:
  """Every prunable group's channels score the same: nothing to rank them by."""
  tied = [np.ptp(np.asarray(scores[g.id])) == 0 for g in graph.prunable_groups if g.id in scores]
  return bool(tied) and all(tied)


def _has_batch_norm(model: Any, variables: PyTree) -> bool:
  """Whether the model keeps BatchNorm statistics (Linen's `batch_stats`, NNX's
  `BatchStat`, a leaf named so in a plain function's variables)."""
  if isinstance(model, nnx.Module):
    return bool(jax.tree.leaves(nnx.state(model, nnx.BatchStat)))
  return distance.has_batch_norm(variables)


def _check_train_model(model, variables, example_args, linen, recalibrate_bn) -> None:
  """`LinenOptions.train_model` / `train_kwargs` serve BatchNorm re-calibration only, and
  the train-mode module must be the model's own architecture (its variables' shapes)."""
  given = [name for name in ('train_model', 'train_kwargs') if getattr(linen, name) is not None]
  if given and not recalibrate_bn:
    raise ValueError(
      f'prune: LinenOptions.{given[0]} is read only when re-calibrating BatchNorm; pass '
      'calibration=jaxprune.structured.Calibration(batches, recalibrate_bn=True), or '
      f'drop {given[0]}.'
    )
  train_model = linen.train_model
  if train_model is None or not isinstance(model, nn.Module):
    return
  kwargs = {'train': True} if linen.train_kwargs is None else dict(linen.train_kwargs)
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  try:
    shapes = jax.eval_shape(lambda: train_model.init(rngs, *example_args, **kwargs))
    theirs = {n: tuple(x.shape) for n, x in named_leaves(shapes)}
  except Exception as e:  # noqa: BLE001 - any failure says it is not this model
    theirs = {'(init fails)': f'{type(e).__name__}: {str(e)[:120]}'}
  ours = {n: tuple(np.shape(x)) for n, x in named_leaves(variables)}
  ours = {n: s for n, s in ours.items() if n.split('/')[0] in ('params', 'batch_stats')}
  theirs = {n: s for n, s in theirs.items() if n.split('/')[0] in ('params', 'batch_stats')}
  if ours != theirs:
    differ = sorted(set(ours.items()) ^ set(theirs.items()), key=str)[:1]
    raise ValueError(
      f'prune: LinenOptions.train_model ({type(train_model).__name__}) has other variables '
      f'than the model ({type(model).__name__}): {differ[0] if differ else theirs}; give '
      f'the same module in train mode, e.g. {type(model).__name__}(train=True).'
    )


@options.moved_arguments
def prune(
  model: Any,
  *example_args: Any,
  variables: PyTree | None = None,
  ratio: float | None = None,
  flops_target: float | None = None,
  importance: str | Mapping[int, Any] = 'l2',
  scope: str = 'uniform',
  search: str = 'greedy',
  constraint: Constraint | None = None,
  calibration: Calibration | None = None,
  linen: LinenOptions | None = None,
  masks: PyTree | None = None,
  norms: str | None = None,
  seed: int = 0,
  check: bool = True,
  progress: bool = True,
) -> PruneResult:
  """Prunes a Flax Linen or NNX model, or a JAX function, to a ratio or a FLOPs target.

  Every argument is checked before anything is traced, and an NNX model is
  changed only once the pruned model has passed the check (and, if asked,
  been re-calibrated): a failure leaves it as it was.

  Args:
    model: a Linen module (give `variables`), an NNX module (pruned in
      place; put it in eval mode first so BatchNorm uses running statistics),
      or a function `fn(variables, *args)` such as a haiku, equinox or keras
      model wrapped as in the third-party guide (give `variables`; `linen`
      and `Calibration(recalibrate_bn=True)` do not apply).
    *example_args: example inputs; the model is traced at these shapes. With
      `variables` not given as a keyword, the first of them is the variables
      (`prune(model, variables, x)`, the order of `model.apply` and
      `oneshot.prune`).
    variables: the Linen variables, or the pytree a function's first
      argument takes.
    ratio: fraction of channels to remove (per group, or overall with
      `scope='global'`).
    flops_target: fraction of the dense FLOPs to keep instead.
    importance: 'l1', 'l2', 'bn_scale', 'density', 'random', 'taylor' (needs
      `calibration` with a `loss_fn`) or `{group id: scores}`.
    scope: 'uniform' or 'global' for `ratio`.
    search: 'greedy' or 'knapsack' for `flops_target`.
    constraint: a `Constraint` (min channels, round_to, locked regexes).
    calibration: a `Calibration`: the batches (and `loss_fn`) for Taylor
      importance, and `recalibrate_bn` to re-estimate BatchNorm statistics on
      them.
    linen: a `LinenOptions`: how to call a Linen module (`apply_kwargs`, and
      `train_kwargs` / `train_model` for BatchNorm re-calibration).
    masks: masks for `importance='density'`.
    norms: None keeps the residual stream (width) whole; 'renormalise' lets it
      be pruned through LayerNorm/RMSNorm, each norm then dividing by the kept
      width as the resized Flax modules do. Such groups are approximate: give
      `Constraint(allow_approximate=True)` to select them. ('exact' is for
      `trace` and the pruned callable only.)
    seed: seed for `importance='random'`.
    check: verify the pruned callable and the pruned model itself
      (`result.apply`, or the NNX model) against the masked model (the dense
      model with the removed channels zeroed) on the example inputs, raising,
      changing nothing, if they differ; and measure how far the result is from
      the dense model (`PruneResult.dense_distance`).
    progress: tqdm progress bars for the calibration passes.

  Returns:
    A `PruneResult`.

  Raises:
    TypeError: for the keywords that moved into `calibration` and `linen`
      (`loss_fn`, `calibration_batches`, `inputs`, `recalibrate_bn`,
      `apply_kwargs`, `train_kwargs`, `train_model`), naming the new form; for
      keywords it never took (`sparsity=` names `ratio=` and `flops_target=`);
      for an array where the variables go, and a Linen module's bare params
      (wrap them: `{'params': params}`).
    ValueError: for a Linen module whose variables lack a collection it reads
      (`batch_stats`) or whose example inputs do not fit its params, and for
      `masks=` without `importance='density'`, each naming the fix.
  """
  _check_group('calibration', calibration, Calibration)
  _check_group('linen', linen, LinenOptions)
  calibration, linen = calibration or Calibration(None), linen or LinenOptions()
  if calibration.batches is not None:  # read once, whatever iterable it is
    calibration = dataclasses.replace(calibration, batches=list(calibration.batches))
  if variables is None and len(example_args) >= 2 and not isinstance(model, nnx.Module):
    # prune(model, variables, x): the order of oneshot.prune and of model.apply.
    variables, example_args = example_args[0], example_args[1:]
  misuse.variables_first(model, variables, example_args)
  misuse.linen_variables(model, variables)
  adapted = models.adapter(model, variables, linen, calibration.recalibrate_bn)
  _check_arguments(
    example_args,
    ratio,
    flops_target,
    importance,
    scope,
    search,
    constraint,
    calibration,
    linen,
    norms,
    masks,
  )
  _check_train_model(model, variables, example_args, linen, calibration.recalibrate_bn)
  fn, variables = adapted.traced()
  with misuse.explained_trace(model, variables, example_args):
    graph = trace(fn, variables, *example_args, norms=norms)
  scores = _scores(graph, variables, importance, fn, calibration, progress, masks, seed)
  plan = selectors.select(
    graph,
    variables,
    ratio=ratio,
    flops_target=flops_target,
    importance=scores,
    scope=scope,
    search=search,
    constraint=constraint,
  )
  new_variables, pruned_fn = apply_plan(graph, variables, plan)
  checked_fn = checked_callable(graph, plan, pruned_fn)
  runs = [('the pruned callable', lambda *a: checked_fn(new_variables, *a))]
  run_model = adapted.runner(new_variables)
  if run_model is not None:
    runs.append((adapted.name, run_model))
  check_fn, model_check, dense_outputs = None, None, None
  if check:
    reports = _verified(graph, variables, plan, example_args, runs)
    check_fn, model_check = (
      dataclasses.replace(report, shortfall=plan.shortfall) for report in (reports[0], reports[-1])
    )
    input_sets, described = distance.input_sets(
      example_args, calibration.batches, calibration.inputs
    )
    dense_fn = jax.jit(fn)  # before an NNX model is changed
    dense_outputs = [dense_fn(variables, *args) for args in input_sets]
  flops = graph.total_flops, cost.plan_flops(graph, plan)
  if calibration.recalibrate_bn:
    new_variables = adapted.recalibrated(
      new_variables, calibration.batches, calibration.inputs, progress
    )
  new_variables = adapted.committed(new_variables)  # only now is an NNX model changed
  dense_distance = None
  if dense_outputs is not None:
    pruned_outputs = [pruned_fn(new_variables, *args) for args in input_sets]
    dense_distance = distance.distance(
      dense_outputs, pruned_outputs, described, batch_norm=_has_batch_norm(model, variables)
    )
  return PruneResult(
    adapted.pruned_model(pruned_fn),
    new_variables,
    plan,
    graph,
    pruned_fn,
    *flops,
    check_fn,
    model_check,
    dense_distance,
    plan.shortfall,
  )
