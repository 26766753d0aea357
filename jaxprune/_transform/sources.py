"""Where a step's mask update reads the pruned leaves (semantics.md#applying-the-masks).

The mask update runs under the step's conditional, which stores what it reads. Each
source names what that is: the params alone (`mask_source='params'`), or the params and
the optimizer's updates (both forms: `pruned` runs its optimizer first).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
from jax import Array, lax

from jaxprune._search import counting as counting
from jaxprune._transform import updates as updates_lib

PyTree = Any


def _weights_of(arrays: list[Array]) -> list[counting.WeightReader]:
  """Each array as the reader the mask rules read it with."""
  return [counting.WeightReader.of(a) for a in arrays]


@dataclasses.dataclass(frozen=True)
class Source:
  """Where one step's mask update reads the pruned leaves, in the params' order.

  Attributes:
    operands: all that the mask update's conditional reads.
    weights: `operands -> [counting.WeightReader]`, the weights to threshold.
    params: `operands -> [array]`, the pruned leaves of the params the step starts
      from (for the moved-weights check).
    passed_through: `operands -> [array]`, what the conditional hands back unchanged,
      for the step to read after it (see `from_updates`).
  """

  operands: Any
  weights: Callable[[Any], list[counting.WeightReader]]
  params: Callable[[Any], list[Array]]
  passed_through: Callable[[Any], list[Array]] = lambda operands: []


def from_params(params: PyTree, pruned: list[int]) -> Source:
  """`mask_source='params'`: the weights the step starts from, already in memory, so
  steps without an update pay nothing for the update's conditional."""
  return Source([jax.tree.leaves(params)[i] for i in pruned], _weights_of, list)


@jax.jit
def _stored(params: Array, updates: Array, pass_value: Any) -> Array:
  """`from_updates`' weights, read through `counting.read_in_pass(..., pass_value)`: stored
  arrays of params and updates (traced once per shape)."""
  params, updates = counting.read_in_pass((params, updates), pass_value)
  return updates_lib.stored_weight(params, updates, inline=False)


def from_updates(params: PyTree, updates: PyTree, pruned: list[int]) -> Source:
  """The chained form: the weights as `optax.apply_updates` will store them
  (docs/explanation/semantics.md#applying-the-masks), recomputed in each pass from the
  params and the updates, which the conditional reads and so stores (once: it carries
  them out for the masking)."""

  def weights(operands):
    return [
      counting.WeightReader(functools.partial(_stored, p, u))
      for p, u in zip(*operands, strict=True)
    ]

  param_leaves, update_leaves = jax.tree.leaves(params), jax.tree.leaves(updates)
  operands = ([param_leaves[i] for i in pruned], [update_leaves[i] for i in pruned])
  # The masking after the conditional reads the updates it carries out: XLA:CPU would
  # otherwise recompute the optimizer's last stage there (Adam's product with the
  # learning rate) and store its input too, besides the updates the conditional reads.
  return Source(
    operands, weights, lambda operands: operands[0], lambda o: lax.optimization_barrier(o[1])
  )
