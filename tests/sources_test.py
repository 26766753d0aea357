"""Where a step's mask update reads the pruned leaves (`jaxprune._transform.sources`): the weights
each source hands the rule, against `optax.apply_updates` and the params themselves."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxprune._transform import sources as sources

PARAMS = {
  'bias': jnp.asarray([0.5, -0.5]),
  'kernel': jnp.asarray([[1.0, 2.0], [3.0, 4.0]]),
  'out': jnp.asarray([[1.0, -1.0, 0.25]]),
}
UPDATES = {
  'bias': jnp.asarray([1.0, 1.0]),
  'kernel': jnp.asarray([[0.125, -2.0], [1e-8, 0.0]]),
  'out': jnp.asarray([[-1.0, 1.0, 0.5]]),
}
PRUNED = [1, 2]  # kernel and out, in the leaves' (sorted keys') order


def test_from_params_reads_the_params_the_step_starts_from():
  source = sources.from_params(PARAMS, PRUNED)
  read = [reader() for reader in source.weights(source.operands)]
  np.testing.assert_array_equal(read[0], PARAMS['kernel'])
  np.testing.assert_array_equal(read[1], PARAMS['out'])
  for param, weights in zip(source.params(source.operands), read, strict=True):
    np.testing.assert_array_equal(param, weights)  # the moved check reads the same leaves
  assert source.passed_through(source.operands) == []


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_from_updates_reads_the_weights_apply_updates_will_store(dtype):
  params = jax.tree.map(lambda x: x.astype(dtype), PARAMS)
  updates = UPDATES  # float32 updates on narrower params: apply_updates rounds the sum
  source = sources.from_updates(params, updates, PRUNED)
  stored = optax.apply_updates(params, updates)
  for reader, name in zip(source.weights(source.operands), ('kernel', 'out'), strict=True):
    for pass_value in (None, jnp.int32(2)):  # read alone, and inside a counting pass
      weights = jax.jit(reader.read)(pass_value) if pass_value is not None else reader()
      assert weights.dtype == stored[name].dtype
      np.testing.assert_array_equal(np.asarray(weights), np.asarray(stored[name]))


def test_from_updates_hands_back_the_pruned_params_and_updates():
  source = sources.from_updates(PARAMS, UPDATES, PRUNED)
  params, carried = source.params(source.operands), source.passed_through(source.operands)
  np.testing.assert_array_equal(params[0], PARAMS['kernel'])
  np.testing.assert_array_equal(params[1], PARAMS['out'])
  np.testing.assert_array_equal(carried[0], UPDATES['kernel'])
  np.testing.assert_array_equal(carried[1], UPDATES['out'])
  assert len(jax.tree.leaves(source.operands)) == 4  # the bias is not read
