"""How masks meet params and updates: the stored weight, the masked update, zeroing.

docs/explanation/semantics.md#applying-the-masks: a mask is applied by returning
`-params` as the update of a pruned weight, so after `optax.apply_updates` it is exactly
zero and a kept weight is exactly what the optimizer alone gives. Every jaxprune
transform (`pruning`, `pruned`, `jaxprune.sparse`'s rules) and every function that bakes
masks into params (`apply_masks`, `functional.remove`, `oneshot`) goes through these,
so that all of them round narrow floats (bfloat16, float16) as the optimizer step does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax


def as_stored(values: Array, dtype: Any) -> Array:
  """`values` rounded to `dtype`, the way `optax.apply_updates` stores them.

  XLA computes narrow floats in float32 and drops a round trip through them
  (f32 -> bf16 -> f32, or a bf16 sum read back as f32) as "excess precision";
  reduce_precision is the rounding it keeps.
  """
  info = jnp.finfo(dtype)
  if info.bits < 32:
    values = lax.reduce_precision(values, exponent_bits=info.nexp, mantissa_bits=info.nmant)
  return values.astype(dtype)


def rounded(updates: Array) -> Array:
  """`updates` rounded to their dtype, as a transform's output stores them (computed
  inline, narrow floats would keep XLA's float32 excess precision)."""
  return as_stored(updates, updates.dtype)


def stored_weight(params: Array, updates: Array, *, inline: bool = True) -> Array:
  """`params + updates` as `optax.apply_updates` stores them: the weight after this step.

  With `inline` (updates computed in the same program), the updates are rounded to
  their dtype first (`rounded`), and XLA:CPU, which fuses a bare `p + u` whose `u` ends
  in a multiply into one multiply-add (rounding once where the step rounds twice), is
  kept from it by a select whose condition is always true (a NaN param gives NaN either
  way). Updates that arrive as stored arrays (the chained form's) need neither, and the
  select costs there: the chained step's non-update steps took half as long again on
  the CPU with it.
  """
  if not inline:
    return as_stored(params + updates, params.dtype)
  keep = ~jnp.isnan(params)
  return as_stored(params + jnp.where(keep, rounded(updates), -params), params.dtype)


@jax.jit
def masked_update(mask: Array, updates: Array, params: Array) -> Array:
  """The update after which the weights outside `mask` are exactly zero and the others
  exactly `stored_weight(params, updates)`: `where(mask, updates, -params)`."""
  return jnp.where(mask, rounded(updates), -params).astype(updates.dtype)


def zeroed(mask: Array, values: Array) -> Array:
  """`values` with zeros where `mask` is False, in their dtype: `where(mask, values, 0)`."""
  values = jnp.asarray(values)
  return jnp.where(mask, values, jnp.zeros((), values.dtype))
