"""The end of gradual channel pruning: the pruning state as a `Plan`, and the smaller model.

    result = jaxprune.channels.shrink(rule, variables, opt_state, x)
    logits = result.pruned_fn(result.variables, x)

The masks a `ChannelRule` made are whole channels, so the channels they
remove are read back from them (`plan`), and `apply_plan` cuts those
channels out of every variable. The masked model and the shrunk one compute
the same function: `shrink` checks it on example inputs when given some.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._names import leaf_name
from jaxprune._results.flops import FlopsReport
from jaxprune._results.summaries import get_masks
from jaxprune.channels._rule import ChannelRule, channel_keeps_from_masks, leaf_masks
from jaxprune.structured import (
  DenseDistance,
  Plan,
  VerifyReport,
  apply_plan,
  make_plan,
  plan_flops,
)
from jaxprune.structured._shared import (
  checked_callable,
  compare,
  computation_rtol,
  dense_distance,
  has_batch_norm,
  traced_outputs,
)

PyTree = Any


def _pruned_masks(rule: ChannelRule, state: Any) -> list[np.ndarray]:
  """The masks of the rule's pruned leaves, on the host; ValueError if they do not fit."""
  masks = get_masks(state)
  flat = jax.tree.leaves(masks, is_leaf=lambda x: x is None)
  layout = rule.layout
  if len(flat) != len(layout.names) or any(
    (flat[i] is None) != (i not in layout.pruned) for i in range(len(flat))
  ):
    raise ValueError(
      'channels: the pruning state was not made by this ChannelRule (its masks '
      'cover other leaves); pass the optimizer state of '
      'jaxprune.pruning(..., mask_rule=rule).'
    )
  return [np.asarray(flat[i]) for i in layout.pruned]


def channel_masks(rule: ChannelRule, state: Any) -> dict[int, np.ndarray]:
  """`{group id: bool (size,)}`, True for the channels a pruning state keeps.

  Args:
    rule: the `ChannelRule` of the transform.
    state: its `PruningState`, or an optax state containing it.

  Raises:
    ValueError: when the state's masks are not whole channels of this rule's
      groups (another rule's or an elementwise state).
  """
  masks = _pruned_masks(rule, state)
  keeps = [np.asarray(k) for k in channel_keeps_from_masks(rule.layout, masks, xp=np)]
  expected = leaf_masks(rule.layout, [jnp.asarray(k) for k in keeps])
  for index, mask, want in zip(rule.layout.pruned, masks, expected, strict=True):
    if not np.array_equal(mask, np.asarray(want)):
      raise ValueError(
        f'channels: the mask of {rule.layout.names[index]!r} is not made of '
        "whole channels of this rule's groups; pass the optimizer state of "
        'jaxprune.pruning(..., mask_rule=rule).'
      )
  return {g.id: k for g, k in zip(rule.layout.groups, keeps, strict=True)}


def plan(rule: ChannelRule, state: Any) -> Plan:
  """The channels the pruning state removes, as a structured `Plan` of `rule.graph`."""
  removed = {gid: np.flatnonzero(~keep) for gid, keep in channel_masks(rule, state).items()}
  return make_plan(rule.graph, {gid: r for gid, r in removed.items() if r.size})


def masked_variables(rule: ChannelRule, variables: PyTree, state: Any) -> PyTree:
  """`variables` (as traced) with the state's masks applied to the params inside them."""
  masks = get_masks(state)
  by_name = {leaf_name(path): mask for path, mask in jax.tree_util.tree_flatten_with_path(masks)[0]}
  prefix = '' if rule.params_key is None else rule.params_key + '/'

  def apply(path, leaf):
    name = leaf_name(path)
    mask = by_name.get(name[len(prefix) :]) if name.startswith(prefix) else None
    if mask is None:
      return leaf
    return jnp.where(mask, leaf, jnp.zeros((), jnp.result_type(leaf)))

  return jax.tree_util.tree_map_with_path(apply, variables)


def masked_outputs(rule: ChannelRule, variables: PyTree, removal: Plan, *args: Any) -> PyTree:
  """The traced function on the masked variables, outputs tied to variables (updated
  batch statistics) cut to the kept positions: what the shrunk model must return."""
  return traced_outputs(rule.graph, removal, variables, *args)


@dataclasses.dataclass
class Shrunk(FlopsReport):
  """What `shrink` hands back.

  Attributes:
    variables: the smaller variables (same structure as the traced ones).
    pruned_fn: `pruned_fn(variables, *args)`, the traced function at the new
      shapes (jitted; any batch size; exports with `jax.export`).
    plan: the channels removed.
    flops_before: dot_general + conv FLOPs per call of the dense model, as traced.
    flops_after: the same for the shrunk model.
    check: the exactness check on the example inputs against the masked model
      (the variables with the state's masks applied; None when no inputs were
      given).
    dense_distance: how far the shrunk model is from the model on the variables
      as given, masks not applied (the same when training kept the masked
      weights at zero; None when no inputs were given).
    graph: the rule's DependencyGraph, whose feature channels `summary` counts.
  """

  variables: PyTree
  pruned_fn: Callable
  plan: Plan
  flops_before: float
  flops_after: float
  check: VerifyReport | None
  dense_distance: DenseDistance | None = None
  graph: Any = dataclasses.field(default=None, repr=False)

  def summary(self) -> str:
    """The plan's summary, the FLOPs line (`FlopsReport`), then both checks: against
    the masked model (exactness) and against the variables as given."""
    lines = [self.plan.summary(self.graph), self.flops_line()]
    if self.check is not None:
      lines.append(
        'exactness check against the masked model (the variables with the masks '
        f'applied): passed, largest difference {self.check.max_rel_diff:.2g} of the '
        'output scale'
      )
    if self.dense_distance is not None:
      lines.append(self.dense_distance.line())
    return '\n'.join(lines)


def shrink(rule: ChannelRule, variables: PyTree, state: Any, *example_args: Any) -> Shrunk:
  """Turns a channel-pruning state into a plan and the model into the smaller one.

  Args:
    rule: the `ChannelRule` the transform pruned with.
    variables: the trained variables, structured as traced (for Flax Linen
      `{'params': params, 'batch_stats': ...}`); the state's masks are applied
      to the params inside them first.
    state: the `PruningState`, or the optax state containing it.
    *example_args: inputs to check the shrunk model on; with none, no check.

  Returns:
    A `Shrunk`.

  Raises:
    ValueError: when the state is not this rule's.
    RuntimeError: when the shrunk model's outputs differ from the masked
      model's on the example inputs.
  """
  removal = plan(rule, state)
  masked = masked_variables(rule, variables, state)
  new_variables, pruned_fn = apply_plan(rule.graph, masked, removal)
  report, distance = None, None
  if example_args:
    outputs = checked_callable(rule.graph, removal, pruned_fn)(new_variables, *example_args)
    dense = traced_outputs(rule.graph, removal, variables, *example_args)
    distance = dense_distance(
      [dense], [outputs], 'the example inputs', batch_norm=has_batch_norm(variables)
    )
    masked_out = masked_outputs(rule, masked, removal, *example_args)
    report = compare(masked_out, outputs, rtol_floor=computation_rtol(rule.graph))
    if not report.ok:
      raise RuntimeError(
        f'channels.shrink: the shrunk model differs from the masked model '
        f'(largest difference {report.max_rel_diff:.3g} of the output '
        'scale). Please report this model.'
      )
  flops_after = plan_flops(rule.graph, removal)
  return Shrunk(
    new_variables,
    pruned_fn,
    removal,
    rule.graph.total_flops,
    flops_after,
    report,
    distance,
    graph=rule.graph,
  )
