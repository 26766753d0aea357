"""Tests for jaxprune._results.export: strip, BCOO leaves, the size report, the output check."""

import json
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse

from jaxprune import functional
from jaxprune._results import export as export
from jaxprune._results import sizes


def small_params():
  kernel = jnp.arange(1.0, 17.0).reshape(4, 4)
  return {'Dense_0': {'kernel': kernel, 'bias': jnp.array([1.0, 0.0, 2.0, 0.0])}}


def small_masks():
  return {'Dense_0': {'kernel': jnp.eye(4, dtype=bool), 'bias': None}}


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(32)(x))
    x = nn.relu(nn.Dense(16)(x))
    return nn.Dense(10)(x)


def test_strip_zeroes_masked_entries_and_drops_masks():
  stripped = export.strip(small_params(), small_masks())
  np.testing.assert_array_equal(stripped['Dense_0']['kernel'], np.diag([1.0, 6.0, 11.0, 16.0]))
  np.testing.assert_array_equal(stripped['Dense_0']['bias'], [1.0, 0.0, 2.0, 0.0])


def test_strip_rejects_a_mask_tree_of_the_wrong_shape():
  with pytest.raises(ValueError, match='parallel to params'):
    export.strip(small_params(), {'Dense_0': {'kernel': jnp.eye(4, dtype=bool)}})


def test_to_bcoo_converts_masked_leaves_only():
  sparse_params = export.to_bcoo(small_params(), small_masks())
  kernel = sparse_params['Dense_0']['kernel']
  assert isinstance(kernel, sparse.BCOO)
  assert kernel.nse == 4 and kernel.indices.dtype == jnp.int32
  np.testing.assert_array_equal(kernel.todense(), np.diag([1.0, 6.0, 11.0, 16.0]))
  assert not isinstance(sparse_params['Dense_0']['bias'], sparse.BCOO)
  dense = export.densify(sparse_params)
  np.testing.assert_array_equal(dense['Dense_0']['kernel'], np.diag([1.0, 6.0, 11.0, 16.0]))


@pytest.mark.slow
def test_to_bcoo_without_masks_converts_matrices_and_names_restrict():
  params = {
    'a': {'kernel': jnp.eye(3), 'bias': jnp.zeros(3)},
    'b': {'kernel': jnp.zeros((2, 2, 3))},
  }
  converted = export.to_bcoo(params)
  assert isinstance(converted['a']['kernel'], sparse.BCOO) and converted['a']['kernel'].nse == 3
  assert isinstance(converted['b']['kernel'], sparse.BCOO) and converted['b']['kernel'].nse == 0
  assert not isinstance(converted['a']['bias'], sparse.BCOO)
  only_a = export.to_bcoo(params, names='^a/')
  assert not isinstance(only_a['b']['kernel'], sparse.BCOO)


def test_size_report_numbers():
  report = sizes.size_report(small_params(), small_masks())
  kernel, bias = {leaf.name: leaf for leaf in report.leaves}['Dense_0/kernel'], report.leaves[0]
  assert bias.name == 'Dense_0/bias' and not bias.sparse
  assert (bias.dense_bytes, bias.sparse_bytes, bias.zeros) == (16, 16, 2)
  # 16 float32 = 64 B dense; 4 kept values (16 B) + 4 x 2 int32 indices (32 B) = 48 B.
  assert (kernel.dense_bytes, kernel.sparse_bytes, kernel.nse) == (64, 48, 4)
  assert kernel.sparsity == 0.75
  stripped_bytes = np.diag(np.array([1, 6, 11, 16], np.float32)).tobytes()
  assert kernel.compressed_bytes == len(zlib.compress(stripped_bytes, 9))
  assert report.dense_bytes == 80 and report.sparse_bytes == 64
  table = str(report)
  assert '| Dense_0/kernel |' in table and '75.0%' in table and '1.25x smaller' in table
  summary = json.loads(json.dumps(report.as_dict()))
  assert summary['sparse_bytes'] == 64 and summary['leaves'][1]['sparsity'] == 0.75


def test_size_report_int64_indices_cost_more():
  report = sizes.size_report(small_params(), small_masks(), index_dtype=jnp.int16)
  assert report.leaves[1].sparse_bytes == 4 * 4 + 4 * 2 * 2


@pytest.mark.slow
def test_sparse_mlp_gives_the_dense_outputs():
  model = MLP()
  x = jax.random.normal(jax.random.key(1), (5, 24))
  params = model.init(jax.random.key(0), x)['params']
  masks = functional.global_unstructured(params, 0.8)
  fn = lambda p, inputs: model.apply({'params': p}, inputs)
  worst = export.check_sparse_outputs(fn, params, masks, x)
  assert worst < 1e-5
  sparse_fn = jax.jit(export.sparse_apply(fn))
  sparse_params = export.to_bcoo(params, masks)
  dense_out = fn(export.strip(params, masks), x)
  np.testing.assert_allclose(sparse_fn(sparse_params, x), dense_out, rtol=1e-5, atol=1e-5)
  # The products really run on the sparse kernels.
  jaxpr = str(jax.make_jaxpr(export.sparse_apply(fn))(sparse_params, x))
  assert jaxpr.count('bcoo_dot_general') == 3
  # Pruning changed the model: the check is not comparing a model with itself.
  assert float(jnp.max(jnp.abs(dense_out - fn(params, x)))) > 1e-3


def test_check_sparse_outputs_reports_a_mismatch():
  calls = []

  def drifting(p, inputs):
    calls.append(None)
    return inputs @ p['Dense_0']['kernel'] + len(calls)  # 1 for the dense run, 2 for the sparse

  with pytest.raises(export.OutputMismatchError, match='differ by up to 1 ') as err:
    export.check_sparse_outputs(drifting, small_params(), small_masks(), jnp.ones((2, 4)))
  # A library error, not an assertion (those vanish under `python -O`).
  assert not isinstance(err.value, AssertionError)
  assert (err.value.max_difference, err.value.rtol, err.value.atol) == (1.0, 1e-5, 1e-5)


# The dense params are fed at every step (the weights TF's reference masks in its graph),
# so pruned weights are never zeroed and the moved-weights check warns, as it should.
@pytest.mark.slow
@pytest.mark.filterwarnings('ignore:jaxprune.*no longer zero:UserWarning')
def test_strip_and_report_accept_an_optax_state():
  import optax

  import jaxprune

  params = {'Dense_0': {'kernel': jnp.arange(1.0, 101.0).reshape(10, 10), 'bias': jnp.ones(10)}}
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.5,pruning_frequency=1,sparsity_function_end_step=1,threshold_method=exact'
  )
  tx = optax.chain(optax.sgd(0.0), jaxprune.pruning(hparams))
  opt_state = tx.init(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(3):
    _, opt_state = update(zero, opt_state, params)
  stripped = export.strip(params, opt_state)
  # Exact k-th magnitude at s = 0.5 on 1..100 keeps 51..100.
  expected = np.where(np.arange(1, 101) > 50, np.arange(1, 101), 0).reshape(10, 10)
  np.testing.assert_array_equal(stripped['Dense_0']['kernel'], expected)
  report = sizes.size_report(params, opt_state)
  assert {leaf.name: leaf.nse for leaf in report.leaves}['Dense_0/kernel'] == 50
