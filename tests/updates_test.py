"""How masks meet params and updates (`jaxprune._transform.updates`), in float32 and narrow
floats."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxprune._transform import updates as updates_lib


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_stored_weight_and_masked_update_round_as_apply_updates(dtype):
  rng = np.random.default_rng(0)
  params = jnp.asarray(rng.standard_normal((16, 16)), dtype)
  grads = jnp.asarray(rng.standard_normal((16, 16)), dtype)
  mask = jnp.asarray(rng.random((16, 16)) < 0.5)

  @jax.jit
  def step(params, grads):  # the update computed inline, as a transform computes it
    updates = (-0.37 * grads).astype(dtype)
    return (
      updates,
      updates_lib.stored_weight(params, updates),
      updates_lib.masked_update(mask, updates, params),
    )

  updates, stored, masked = step(params, grads)
  want = optax.apply_updates(params, updates)
  assert stored.dtype == masked.dtype == dtype
  np.testing.assert_array_equal(np.asarray(stored, np.float32), np.asarray(want, np.float32))
  applied = np.asarray(optax.apply_updates(params, masked), np.float32)
  np.testing.assert_array_equal(applied, np.where(mask, np.asarray(want, np.float32), 0.0))


def test_zeroed_keeps_the_dtype_and_nan_outside_the_mask_goes():
  values = jnp.array([1.0, np.nan, -2.0], jnp.bfloat16)
  got = updates_lib.zeroed(jnp.array([True, False, False]), values)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32), [1.0, 0.0, 0.0])
  assert np.signbit(np.asarray(updates_lib.zeroed(jnp.array([False]), jnp.array([-2.0])))) == 0


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_stored_updates_give_the_same_weight_without_the_inline_guard(dtype):
  # The chained form's updates arrive as stored arrays: the bare sum is apply_updates.
  rng = np.random.default_rng(1)
  params = jnp.asarray(rng.standard_normal((16, 16)), dtype)
  updates = jnp.asarray(0.37 * rng.standard_normal((16, 16)), dtype)
  stored = jax.jit(lambda p, u: updates_lib.stored_weight(p, u, inline=False))(params, updates)
  want = optax.apply_updates(params, updates)
  assert stored.dtype == dtype
  np.testing.assert_array_equal(np.asarray(stored, np.float32), np.asarray(want, np.float32))
