"""The verification oracle: the pruned model equals the dense model with the
removed channels zeroed (docs/explanation/structured_design.md#verify-the-oracle)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from jaxprune.structured._core import jaxprs
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.kept import PlanShapes
from jaxprune.structured._core.plan import Plan, as_plan
from jaxprune.structured._primitives import observe
from jaxprune.structured._shrink.apply import replayed_fn, shrink_variables, zeroed_variables
from jaxprune.structured._shrink.shrinker import Shrinker

PyTree = Any


@dataclasses.dataclass(frozen=True)
class VerifyReport:
  """Outcome of `verify`.

  Attributes:
    ok: every output agrees within tolerance.
    max_rel_diff: largest |pruned - zeroed dense| of an output leaf divided
      by the largest |zeroed dense| of that leaf (its scale).
    max_abs_diff: largest |pruned - zeroed dense| over all outputs.
    max_abs_ref: largest |zeroed dense| output, for scale.
    per_group: `{group id: max_rel_diff}` when checked group by group.
    approximate: the plan's groups marked approximate (their norm statistics
      change, see `trace(norms=...)`); when there are any, `max_rel_diff` is
      how far the pruned model strays from the zeroed dense model, checked
      against `bound`, and `frozen_rel_diff` is the exact check.
    frozen_rel_diff: the same difference with every norm statistic the plan
      changes taken from the zeroed dense model: everything but the
      statistics must then agree to the exact tolerance.
    bound: the tolerance `max_rel_diff` was held to for approximate groups.
    shortfall: the plan's `shortfall`: None when it removes what its target asked
      for (or was made by hand); else what was asked and what it removes. `ok`
      says the channels it removes were cut out exactly; this says whether
      enough went.
  """

  ok: bool
  max_rel_diff: float
  max_abs_diff: float
  max_abs_ref: float
  per_group: Mapping[int, float] = dataclasses.field(default_factory=dict)
  approximate: tuple[int, ...] = ()
  frozen_rel_diff: float | None = None
  bound: float | None = None
  shortfall: str | None = None

  def __bool__(self) -> bool:
    return self.ok

  @property
  def complete(self) -> bool:
    """The plan removed what its target asked for (`shortfall` is None)."""
    return self.shortfall is None

  def summary(self) -> str:
    """One line: passed or FAILED, the largest difference, and any shortfall."""
    verdict = 'passed' if self.ok else 'FAILED'
    line = f'verify {verdict}: largest difference {self.max_rel_diff:.2g} of the output scale'
    if self.approximate:
      line += f' (approximate groups, bound {self.bound}; frozen {self.frozen_rel_diff:.2g})'
    if self.shortfall is not None:
      line += f'; SHORT OF THE TARGET: {self.shortfall}'
    return line


# Differences that summing in another order (channels absent instead of
# zero) leaves, relative to an output's scale: a few hundred ulps of deep
# float32 models (haiku ResNet-18: 7e-7), far below what a wrong channel
# mapping gives (1e-2 and more).
_RTOL = {
  np.dtype(np.float64): 1e-10,
  np.dtype(np.float32): 1e-4,
  np.dtype(np.float16): 1e-2,
  np.dtype(jnp.bfloat16): 2e-2,
}


# How far (relative to an output's scale) `verify` lets approximate groups
# move the outputs by default. Measured under norms='renormalise' on the zoo's
# random-weight transformers (2 layers, width 32; L2, round_to=1), 30% of the
# width alone / 30% of every group: BERT 0.08 / 0.12, ViT 0.30 / 0.34, GPT-2
# 0.38 / 0.36, Llama 0.80 / 0.49. The bound only says the outputs kept their
# scale; a wrong channel mapping is caught by the frozen-statistics check.
APPROXIMATE_RTOL = 1.0


def full_precision() -> contextlib.AbstractContextManager:
  """Float32 matrix products and convolutions at full precision in the code it traces.

  The checks run both models so: GPUs (TF32) and TPUs (bfloat16 passes) round float32
  products by default to about 1e-3 of an output's scale, ten times the float32
  tolerance, and differently in the dense and the pruned model. A model's own code
  (a Flax model's apply) is traced again inside it; the graph's jaxprs, whose
  products were set when they were traced, are rewritten (`full_precision_graph`).
  """
  return jax.default_matmul_precision('highest')


def full_precision_graph(graph: DependencyGraph) -> DependencyGraph:
  """`graph` with the products its model left at the default precision at full float32
  precision (`jaxprs.with_precision`), for the checks' replays.

  On CPUs, which multiply float32 in full at any precision, `graph` itself: a check then
  compiles the pruned callable users run, once.
  """
  if jax.default_backend() == 'cpu':
    return graph
  highest = lax.Precision.HIGHEST
  entries = [
    dataclasses.replace(point, closed_jaxpr=jaxprs.with_precision(point.closed_jaxpr, highest))
    for point in graph.entries
  ]
  proxied = {key: jaxprs.eqn_with_precision(eqn, highest) for key, eqn in graph.proxied.items()}
  return dataclasses.replace(graph, entries=entries, proxied=proxied, retraced={})


def checked_callable(graph: DependencyGraph, plan: Plan, pruned_fn: Callable) -> Callable:
  """What a check runs for `pruned_fn` (the pruned callable of `graph` and the normalised
  `plan`): the same replay at full precision, or `pruned_fn` itself on CPUs."""
  checked = full_precision_graph(graph)
  return pruned_fn if checked is graph else replayed_fn(checked, plan)


def _float_dtypes(jaxpr: Any) -> set[np.dtype]:
  """The floating dtypes of the values `jaxpr` (a Jaxpr) and its sub-jaxprs compute."""
  found = set()
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      dtype = getattr(var.aval, 'dtype', None)
      if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        found.add(np.dtype(dtype))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          found |= _float_dtypes(inner)
  return found


def computation_rtol(graph: DependencyGraph) -> float:
  """The loosest `default_rtol` of the floating dtypes the traced function computes in.

  A model that multiplies in bfloat16 and casts its logits to float32 (MaxText's default)
  rounds at bfloat16's precision: its float32 outputs are checked at that tolerance, not
  at float32's.
  """
  return max((default_rtol(d) for d in _float_dtypes(graph.closed_jaxpr.jaxpr)), default=0.0)


def default_rtol(dtype: Any) -> float:
  """The default relative tolerance of `verify` for outputs of `dtype` (0 for ints)."""
  dtype = np.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.inexact):  # numpy's says bfloat16 is not inexact
    return 0.0
  return _RTOL.get(dtype, 1e-4)


def traced_outputs(
  graph: DependencyGraph, plan: Plan, variables: PyTree, *args: Any, jit: bool = True
) -> PyTree:
  """The traced function run as traced on full-size `variables`, its outputs tied to
  variables (e.g. Linen's updated `batch_stats`) cut to the positions `plan` keeps: the
  outputs the pruned model must return when `variables` zero the removed channels.
  Products run at full float32 precision (`full_precision`). `jit=False` runs it op by
  op (for primitives with only an eager implementation)."""
  flat = jax.tree_util.tree_leaves((variables, *args))
  run = jcore.jaxpr_as_fun(full_precision_graph(graph).closed_jaxpr)
  outs = (jax.jit(run) if jit else run)(*flat)
  kept = PlanShapes(graph, plan.removed)
  outs = [
    x if isinstance(v, jcore.Literal) else kept.cut((), v, x)
    for v, x in zip(graph.closed_jaxpr.jaxpr.outvars, outs, strict=True)
  ]
  return jax.tree_util.tree_unflatten(graph.out_tree, outs)


def dense_reference(
  graph: DependencyGraph, variables: PyTree, plan: Plan | Mapping, *args: Any, jit: bool = True
) -> PyTree:
  """Outputs of the traced jaxpr, run as traced, on the zeroed dense variables.

  Outputs tied to variables (e.g. Linen's updated `batch_stats`) are cut to
  the kept positions, the shapes the pruned model returns. Its matrix
  products and convolutions run at full float32 precision on every backend:
  run the model to compare inside `jax.default_matmul_precision('highest')`.
  `jit=False` runs it op by op (for primitives with only an eager
  implementation).
  """
  plan = as_plan(graph, plan)
  return traced_outputs(graph, plan, zeroed_variables(graph, variables, plan), *args, jit=jit)


def compare(
  reference: PyTree,
  outputs: PyTree,
  rtol: float | None = None,
  atol: float = 0.0,
  rtol_floor: float = 0.0,
) -> VerifyReport:
  """Compares two output pytrees leaf by leaf, relative to each leaf's scale.

  A leaf agrees when `max|a - b| <= atol + rtol * max|ref|`: float32
  rounding grows with an output's magnitude and a model's depth, not with
  each element's own size.

  Args:
    reference: the expected outputs.
    outputs: the outputs to check.
    rtol: relative tolerance; default per dtype (`default_rtol`: 1e-4 for
      float32, 1e-10 for float64, 1e-2 for float16, 2e-2 for bfloat16,
      exact for integers and bools).
    atol: absolute tolerance on top.
    rtol_floor: the least default relative tolerance (`computation_rtol` of the model
      that made the outputs); ignored where `rtol` is given.

  Returns:
    A `VerifyReport` (without per-group errors).
  """
  ref_leaves, ref_tree = jax.tree_util.tree_flatten(reference)
  out_leaves, out_tree = jax.tree_util.tree_flatten(outputs)
  if ref_tree != out_tree:
    raise ValueError(f'verify: output structures differ: {ref_tree} vs {out_tree}.')
  ok, rel, diff, scale = True, 0.0, 0.0, 0.0
  for ref, out in zip(ref_leaves, out_leaves, strict=True):
    tol = max(default_rtol(np.asarray(ref).dtype), rtol_floor) if rtol is None else rtol
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    leaf_scale = float(np.abs(np.nan_to_num(ref, nan=0.0)).max(initial=0.0))
    if ref.shape != out.shape:
      return VerifyReport(False, float('inf'), float('inf'), max(scale, leaf_scale))
    both_nan = np.isnan(ref) & np.isnan(out)
    err = float(np.where(both_nan, 0.0, np.abs(ref - out)).max(initial=0.0))
    if np.isnan(err):  # NaN on one side only
      err = float('inf')
    ok &= err <= atol + tol * leaf_scale
    rel = max(rel, err / leaf_scale if leaf_scale else (0.0 if err == 0 else float('inf')))
    diff, scale = max(diff, err), max(scale, leaf_scale)
  return VerifyReport(ok, rel, diff, scale)


def _frozen_outputs(
  graph: DependencyGraph, variables: PyTree, plan: Plan, args: tuple, jit: bool
) -> PyTree:
  """The pruned model's outputs with each norm sum taken from the zeroed dense model."""
  flat_args = jax.tree_util.tree_leaves(args)
  graph = full_precision_graph(graph)
  point = graph.entries[0]
  watched = set(graph.norm_sums)
  zeroed = jax.tree_util.tree_leaves(zeroed_variables(graph, variables, plan))
  sums = observe.collect(
    point.closed_jaxpr,
    [*zeroed, *flat_args],
    point.scope,
    lambda s, i, eqn, ins, outs: outs if (s, i) in watched else None,
  )
  shrinker = Shrinker(graph, plan.removed)
  shrinker.overrides = sums
  closed = point.closed_jaxpr
  run = lambda flat: shrinker.run(closed.jaxpr, closed.consts, flat, point.scope)
  new = jax.tree_util.tree_leaves(shrink_variables(graph, variables, plan))
  outs = (jax.jit(run) if jit else run)([*new, *flat_args])
  return jax.tree_util.tree_unflatten(point.out_tree, outs)


def verify(
  graph: DependencyGraph,
  variables: PyTree,
  plan: Plan | Mapping,
  *example_args: Any,
  pruned_fn: Callable | None = None,
  per_group: bool = False,
  rtol: float | None = None,
  atol: float = 0.0,
  jit: bool = True,
  approximate_rtol: float = APPROXIMATE_RTOL,
) -> VerifyReport:
  """Checks a shrink against the zero-the-removed-channels oracle.

  Both models run with float32 matrix products at full precision
  (`jax.default_matmul_precision('highest')`), on every backend: a GPU's TF32
  or a TPU's bfloat16 passes would round them ten times past the tolerance.

  A plan that removes channels of approximate groups (`trace(norms=...)`)
  cannot equal the oracle: the norms' statistics change. It is checked twice:
  exactly, with every statistic it changes frozen to the zeroed dense
  model's (so every channel mapping is checked), and against
  `approximate_rtol` as it runs.

  Args:
    graph: the DependencyGraph.
    variables: the dense variables.
    plan: the plan.
    *example_args: inputs to run both models on.
    pruned_fn: the pruned model to check, `pruned_fn(new_variables, *args)`;
      defaults to `apply_plan`'s pruned callable (pass a rebuilt Flax model's
      apply to check that instead).
    per_group: also apply each group's removal alone and record its error.
    rtol: tolerance relative to each output's scale (its largest |value|);
      default by dtype, see `compare`.
    atol: absolute tolerance on top.
    jit: jit the default pruned callable and the reference (turn off for
      primitives that only have an eager implementation).
    approximate_rtol: how far, relative to each output's scale, the outputs
      may move when the plan touches approximate groups (`APPROXIMATE_RTOL`,
      measured; see its comment).

  Returns:
    A `VerifyReport`; truthy when the pruned outputs match. Its `shortfall` is
    the plan's: a plan that removes less than its target asked for (or
    nothing) passes when what it removes is cut out exactly, and says so there.
  """
  report = _verify(
    graph,
    variables,
    as_plan(graph, plan),
    example_args,
    pruned_fn,
    per_group,
    rtol,
    atol,
    jit,
    approximate_rtol,
  )
  return dataclasses.replace(report, shortfall=getattr(plan, 'shortfall', None))


def _verify(
  graph: DependencyGraph,
  variables: PyTree,
  plan: Plan,
  example_args: tuple,
  pruned_fn: Callable | None,
  per_group: bool,
  rtol: float | None,
  atol: float,
  jit: bool,
  approximate_rtol: float,
) -> VerifyReport:
  """`verify` for a normalised plan."""
  fn = pruned_fn or replayed_fn(full_precision_graph(graph), plan, jit=jit)
  # The public shrink_variables (it maps the normalised plan onto itself): what is checked
  # is the variables users get.
  with full_precision():
    outputs = fn(shrink_variables(graph, variables, plan), *example_args)
  reference = traced_outputs(
    graph, plan, zeroed_variables(graph, variables, plan), *example_args, jit=jit
  )
  approximate = tuple(sorted(gid for gid in plan.removed if graph.groups[gid].approximate))
  floor = computation_rtol(graph)
  if not approximate:
    report = compare(reference, outputs, rtol, atol, floor)
  else:
    free = compare(reference, outputs, approximate_rtol, atol)
    frozen = compare(
      reference, _frozen_outputs(graph, variables, plan, example_args, jit), rtol, atol, floor
    )
    report = dataclasses.replace(
      free,
      ok=free.ok and frozen.ok,
      approximate=approximate,
      frozen_rel_diff=frozen.max_rel_diff,
      bound=approximate_rtol,
    )
  if not per_group:
    return report
  errors, ok = {}, report.ok
  for gid, channels in plan.removed.items():
    single = Plan({gid: channels}, plan.sizes)
    one = _verify(
      graph, variables, single, example_args, None, False, rtol, atol, jit, approximate_rtol
    )
    errors[gid], ok = one.max_rel_diff, ok and one.ok
  return dataclasses.replace(report, ok=ok, per_group=errors)
