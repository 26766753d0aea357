"""Every report in every float dtype: float32, bfloat16 and float16 models.

numpy's `issubdtype` says bfloat16 is not floating (`jnp.issubdtype` says it is), so a
bfloat16 model's reports once compared nothing (`dense_distance`), held its outputs to
exact equality (`verify`) or to float32's tolerance (`check_sparse_outputs`). Expected
numbers come from the arrays the code returns, recomputed here in float64 numpy.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune
import jaxprune.channels
import jaxprune.structured as jps
from jaxprune import oneshot

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
IDS = ['float32', 'bfloat16', 'float16']
# `verify`'s documented default tolerances, relative to an output's largest |value|.
VERIFY_RTOL = {'float32': 1e-4, 'bfloat16': 2e-2, 'float16': 1e-2}


def _mlp(dtype):
  rng = np.random.default_rng(0)
  params = {
    'w1': jnp.asarray(rng.normal(size=(6, 8)), dtype),
    'w2': jnp.asarray(rng.normal(size=(8, 4)), dtype),
  }
  x = jnp.asarray(rng.normal(size=(5, 6)), dtype)
  return (lambda p, x: jnp.tanh(x @ p['w1']) @ p['w2']), params, x


def _f64(x):
  return np.asarray(x, np.float64)


@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_dense_distance_compares_every_float_dtype(dtype):
  fn, params, x = _mlp(dtype)
  result = jps.prune(fn, params, x, ratio=0.25, progress=False)
  dense, pruned = _f64(fn(params, x)), _f64(result.pruned_fn(result.variables, x))
  assert (
    pruned.dtype == np.float64 and np.asarray(result.pruned_fn(result.variables, x)).dtype == dtype
  )
  distance = result.dense_distance
  rel = np.linalg.norm(pruned - dense) / np.linalg.norm(dense)
  assert rel > 0  # two of the 8 hidden channels went
  assert distance.rel_error == pytest.approx(rel, rel=1e-9)
  # (5, 4) outputs are logits: the share of rows whose largest entry is the same.
  assert distance.agreement == np.mean(dense.argmax(-1) == pruned.argmax(-1))
  assert 'no float output' not in result.summary()


@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_verify_holds_outputs_to_their_dtypes_tolerance(dtype):
  fn, params, x = _mlp(dtype)
  graph = jps.trace(fn, params, x)
  [group] = graph.prunable_groups
  plan = jps.make_plan(graph, {group.id: [1, 2]})
  _, pruned_fn = jps.apply_plan(graph, params, plan)
  scale = float(np.max(np.abs(_f64(jps.dense_reference(graph, params, plan, x)))))
  tol = VERIFY_RTOL[np.dtype(dtype).name]

  def off_by(fraction):
    """The pruned model with its first output moved by `fraction` of the tolerance."""
    shift = fraction * tol * scale
    return lambda v, x: pruned_fn(v, x).astype(jnp.float32).at[0, 0].add(shift).astype(dtype)

  assert jps.verify(graph, params, plan, x)
  within = jps.verify(graph, params, plan, x, pruned_fn=off_by(0.5))
  # Rounding the moved output back to its dtype changes it by under a unit (2**-7 of
  # the scale for bfloat16), so it lands between 0.1 and 0.9 of the tolerance.
  assert within.ok and 0.1 * tol < within.max_rel_diff < 0.9 * tol
  assert not jps.verify(graph, params, plan, x, pruned_fn=off_by(2.0))


@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_weight_sparsity_and_summaries_in_every_dtype(dtype):
  # |w| = 1..16; the exact threshold method prunes the 8 smallest magnitudes, 1..8.
  signs = np.where(np.arange(16) % 3 == 0, -1, 1)
  w = (np.arange(1, 17) * signs).reshape(4, 4)
  params = {'dense': {'kernel': jnp.asarray(w, dtype), 'bias': jnp.ones(4, dtype)}}
  tx = jaxprune.pruned(
    optax.sgd(0.0),
    target_sparsity=0.5,
    begin_pruning_step=0,
    sparsity_function_end_step=1,
    pruning_frequency=1,
    threshold_method='exact',
  )
  state = tx.init(params)
  for _ in range(2):
    updates, state = tx.update(jax_zeros(params), state, params)
    params = optax.apply_updates(params, updates)
  kernel = params['dense']['kernel']
  assert kernel.dtype == dtype
  np.testing.assert_array_equal(_f64(kernel) == 0, np.abs(w) <= 8)
  assert float(jaxprune.get_weight_sparsity(state)['dense/kernel']) == 0.5
  assert float(jaxprune.get_weight_sparsity(params)['dense/kernel']) == 0.5
  assert float(jaxprune.summaries(state)['dense/kernel/sparsity']) == 0.5


def jax_zeros(tree):
  return {k: jax_zeros(v) if isinstance(v, dict) else jnp.zeros_like(v) for k, v in tree.items()}


def _layer(dtype):
  rng = np.random.default_rng(1)
  params = {'w': jnp.asarray(rng.normal(size=(8, 6)), dtype)}
  batches = [jnp.asarray(rng.normal(size=(16, 8)), dtype) for _ in range(2)]
  return (lambda p, x: x @ p['w']), params, batches


@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_a_oneshot_report_in_every_dtype(dtype):
  fn, params, batches = _layer(dtype)
  new, _, report = oneshot.prune_with_report(fn, params, batches, method='magnitude', sparsity=0.5)
  assert new['w'].dtype == dtype
  [layer] = report.layers
  assert (layer.name, layer.shape, layer.sparsity) == ('w', (6, 8), 0.5)
  assert float(np.mean(_f64(new['w']) == 0)) == 0.5
  # ||W X - W' X||^2 / ||W X||^2 over the calibration inputs, in float64.
  x = np.concatenate([_f64(b) for b in batches])
  dense, pruned = x @ _f64(params['w']), x @ _f64(new['w'])
  error = np.sum((dense - pruned) ** 2) / np.sum(dense**2)
  assert 0 < layer.error and layer.error == pytest.approx(error, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_export_checks_and_size_report_in_every_dtype(dtype):
  fn, params, batches = _layer(dtype)
  new, masks, _ = oneshot.prune_with_report(fn, params, batches, method='magnitude', sparsity=0.5)
  x = batches[0]
  worst = jaxprune.check_sparse_outputs(fn, new, masks, x)
  # The sparse and the dense product round their sums apart by at most a unit or two of
  # the output's dtype.
  eps = float(jnp.finfo(dtype).eps)
  scale = float(np.max(np.abs(_f64(fn(new, x)))))
  assert worst <= 4 * eps * scale

  # A real difference is still caught: 10% of the output scale, above the bfloat16
  # tolerance of 4 units (4 * 2**-7 = 3.1%) relative plus as much of the scale.
  calls = []

  def drifting(p, x):  # the dense run comes first; every later one (sparse) drifts
    calls.append(None)
    return fn(p, x) + (0.1 * scale if len(calls) > 1 else 0.0)

  with pytest.raises(jaxprune.OutputMismatchError):
    jaxprune.check_sparse_outputs(drifting, new, masks, x)
  report = jaxprune.size_report(new, masks)
  [leaf] = report.leaves
  itemsize = np.dtype(dtype).itemsize
  assert (leaf.dtype, leaf.zeros, leaf.nse) == (np.dtype(dtype).name, 24, 24)
  assert leaf.dense_bytes == 48 * itemsize
  assert leaf.sparse_bytes == 24 * itemsize + 24 * 2 * 4  # values, then (row, col) int32


@pytest.mark.parametrize('dtype', DTYPES, ids=IDS)
def test_channel_rule_prunes_the_groups_of_every_float_dtype(dtype):
  fn, params, x = _mlp(dtype)
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # no group skipped as 'not floating point'
    rule = jaxprune.channels.ChannelRule(jps.trace(fn, params, x))
  # The 8 hidden channels: w1's columns and w2's rows.
  [group] = rule.layout.groups
  assert group.size == 8


def test_outputs_of_a_bfloat16_computation_are_checked_at_its_precision():
  """MaxText multiplies in bfloat16 and casts its logits to float32: its float32 outputs
  carry bfloat16 rounding, and a check at float32's tolerance refused exact prunes."""
  from jaxprune.structured._shrink import verify as verify_lib

  def model(params, x, dtype):
    hidden = jnp.tanh(x.astype(dtype) @ params['w1'].astype(dtype))
    return (hidden @ params['w2'].astype(dtype)).astype(jnp.float32)

  params = {'w1': jnp.ones((4, 8)), 'w2': jnp.ones((8, 2))}
  x = jnp.ones((3, 4))
  rtols = {
    dtype: verify_lib.computation_rtol(
      jaxprune.structured.trace(lambda p, x, d=dtype: model(p, x, d), params, x)
    )
    for dtype in (jnp.float32, jnp.bfloat16)
  }
  assert rtols == {jnp.float32: 1e-4, jnp.bfloat16: 2e-2}
  reference = np.ones((3, 2), np.float32)
  off = reference * (1 + 1e-3)  # one bfloat16 rounding step is 2**-8 = 0.4%
  assert not verify_lib.compare(reference, off).ok
  assert verify_lib.compare(reference, off, rtol_floor=rtols[jnp.bfloat16]).ok
  assert not verify_lib.compare(reference, off, rtol=1e-4, rtol_floor=2e-2).ok  # rtol wins
