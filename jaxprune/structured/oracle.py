"""The verification oracle: the pruned model equals the dense model with the
removed channels zeroed (DESIGN.md, "Structured pass")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from jaxprune.structured.interpret import Shrinker
from jaxprune.structured.plan import Plan
from jaxprune.structured.shrink import as_plan, pruned_callable, shrink_variables, zero_removed

PyTree = Any


@dataclasses.dataclass(frozen=True)
class VerifyReport:
  """Outcome of `verify`.

  Attributes:
    ok: every output agrees within tolerance.
    max_abs_diff: largest |pruned - zeroed dense| over all outputs.
    max_abs_ref: largest |zeroed dense| output, for scale.
    per_group: `{group id: max |diff|}` when checked group by group.
  """
  ok: bool
  max_abs_diff: float
  max_abs_ref: float
  per_group: Mapping[int, float] = dataclasses.field(default_factory=dict)

  def __bool__(self) -> bool:
    return self.ok


def dense_reference(graph: Any, variables: PyTree, plan: Plan | Mapping, *args: Any) -> PyTree:
  """Outputs of the traced jaxpr, run as traced, on the zeroed dense variables.

  Outputs tied to variables (e.g. Linen's updated `batch_stats`) are cut to
  the kept positions, the shapes the pruned model returns.
  """
  plan = as_plan(graph, plan)
  flat = jax.tree_util.tree_leaves((zero_removed(graph, variables, plan), *args))
  jaxpr = graph.closed_jaxpr.jaxpr
  outs = jax.core.eval_jaxpr(jaxpr, graph.closed_jaxpr.consts, *flat)
  shrinker = Shrinker(graph, plan.removed)
  outs = [x if isinstance(v, jcore.Literal) else shrinker.cut((), v, x)
          for v, x in zip(jaxpr.outvars, outs, strict=True)]
  return jax.tree_util.tree_unflatten(graph.out_tree, outs)


def compare(reference: PyTree, outputs: PyTree, rtol: float = 1e-4,
            atol: float = 1e-5) -> VerifyReport:
  """Compares two output pytrees leaf by leaf (|a - b| <= atol + rtol * |ref|)."""
  ref_leaves, ref_tree = jax.tree_util.tree_flatten(reference)
  out_leaves, out_tree = jax.tree_util.tree_flatten(outputs)
  if ref_tree != out_tree:
    raise ValueError(f'verify: output structures differ: {ref_tree} vs {out_tree}.')
  ok, diff, scale = True, 0.0, 0.0
  for ref, out in zip(ref_leaves, out_leaves, strict=True):
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if ref.shape != out.shape:
      return VerifyReport(False, float('inf'), float(np.abs(ref).max(initial=0.0)))
    err = np.abs(ref - out)
    ok &= bool(np.all(err <= atol + rtol * np.abs(ref)))
    diff = max(diff, float(err.max(initial=0.0)))
    scale = max(scale, float(np.abs(ref).max(initial=0.0)))
  return VerifyReport(ok, diff, scale)


def verify(graph: Any, variables: PyTree, plan: Plan | Mapping, *example_args: Any,
           pruned_fn: Callable | None = None, per_group: bool = False,
           rtol: float = 1e-4, atol: float = 1e-5, jit: bool = True) -> VerifyReport:
  """Checks a shrink against the zero-the-removed-channels oracle.

  Args:
    graph: the DependencyGraph.
    variables: the dense variables.
    plan: the plan.
    *example_args: inputs to run both models on.
    pruned_fn: the pruned model to check, `pruned_fn(new_variables, *args)`;
      defaults to `apply_plan`'s pruned callable (pass a rebuilt Flax model's
      apply to check that instead).
    per_group: also apply each group's removal alone and record its error.
    rtol: relative tolerance.
    atol: absolute tolerance.
    jit: jit the default pruned callable (turn off for primitives that only
      have an eager implementation).

  Returns:
    A `VerifyReport`; truthy when the pruned outputs match.
  """
  plan = as_plan(graph, plan)
  fn = pruned_fn or pruned_callable(graph, plan, jit=jit)
  outputs = fn(shrink_variables(graph, variables, plan), *example_args)
  report = compare(dense_reference(graph, variables, plan, *example_args), outputs, rtol, atol)
  if not per_group:
    return report
  errors, ok = {}, report.ok
  for gid, channels in plan.removed.items():
    single = Plan({gid: channels}, plan.sizes)
    one = verify(graph, variables, single, *example_args, rtol=rtol, atol=atol, jit=jit)
    errors[gid], ok = one.max_abs_diff, ok and one.ok
  return dataclasses.replace(report, ok=ok, per_group=errors)
