"""Subnormal weights, which XLA:CPU reads as zero: a leaf of them cannot be pruned as a
sort of its magnitudes would (the backend sees an all-zero leaf, and the optimizer's own
update writes zeros), so `init` and `update_mask` say so, naming the leaf."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune

HP = 'target_sparsity=0.5,pruning_frequency=1,sparsity_function_end_step=1,threshold_method=exact'
TINY = np.float32(1e-40)  # below float32's smallest normal, 2**-126 ~ 1.18e-38


def _kernel(shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_xla_cpu_reads_subnormal_weights_as_zero():
  # The premise of the warnings below (jax-ml/jax#16200: intended on CPU).
  w = jnp.asarray(_kernel((8, 16)) * TINY)
  assert np.count_nonzero(np.asarray(w)) == 128  # stored as given
  assert int(jax.jit(lambda w: jnp.sum(jnp.abs(w) > 0))(w)) == 0
  assert float(jnp.max(jnp.abs(w))) == 0.0
  assert np.count_nonzero(np.asarray(optax.apply_updates(w, jnp.zeros_like(w)))) == 0


def _record(caught):
  found = [w for w in caught if 'subnormal' in str(w.message)]
  assert len(found) == 1, [str(w.message) for w in caught]
  return found[0]


def _message(caught):
  return str(_record(caught).message)


@pytest.mark.slow
@pytest.mark.parametrize('form', ['pruned', 'chained'])
def test_init_names_each_leaf_of_subnormal_weights(form):
  tiny = _kernel((16, 4), seed=1) * TINY
  params = {
    'Dense_0': {'kernel': jnp.asarray(_kernel((8, 16)))},
    'Dense_1': {'kernel': jnp.asarray(tiny)},
  }
  tx = (
    jaxprune.pruned(optax.sgd(0.0), HP)
    if form == 'pruned'
    else optax.chain(optax.sgd(0.0), jaxprune.pruning(HP))
  )
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    state = tx.init(params)
  message = _message(caught)
  if form == 'pruned':  # optax.chain's init calls the chained one
    assert _record(caught).filename == __file__  # points at the user's init
  assert f'Dense_1/kernel (largest |w| {np.max(np.abs(tiny)):.3g})' in message
  assert 'Dense_0' not in message
  assert 'XLA on CPU reads them as zero' in message
  assert 'Rescale the weights' in message
  for _ in range(2):  # step 1 updates the masks
    updates, state = tx.update(params, state, params)
    params = optax.apply_updates(params, updates)
  masks = state[1].masks
  # What was told: the normal leaf is pruned to 64 of 128, the subnormal one keeps its
  # mask (a sort would keep 32 of 64), and the optimizer's add wrote zeros. The exact rule
  # keeps round(128 * 0.5) = 64.
  assert int(masks['Dense_0']['kernel'].sum()) == 64
  assert bool(masks['Dense_1']['kernel'].all())
  assert np.count_nonzero(np.asarray(params['Dense_1']['kernel'])) == 0


def test_update_mask_warns_and_a_stacked_layer_is_named():
  w = _kernel((8, 16)) * TINY
  with pytest.warns(UserWarning, match=r'update_mask: these pruned weights are all subnormal'):
    threshold, mask = jaxprune.update_mask(w, jnp.float32(0), jnp.float32(0.5))
  assert float(threshold) == 0.0 and bool(mask.all())
  stacked = {'Dense_0': {'kernel': np.stack([_kernel((8, 16)), w, _kernel((8, 16), 2)])}}
  with pytest.warns(UserWarning) as caught:
    jaxprune.pruning(HP, layer_axes_map=['Dense_0:1']).init(stacked)
  assert re.search(r': Dense_0/kernel\[1\] \(largest', _message(caught))


def test_no_warning_for_normal_weights_global_mixes_and_traced_params():
  normal = {'Dense_0': {'kernel': _kernel((8, 16)) * np.float32(1e-30)}}  # small, normal
  mixed = {'a': {'kernel': _kernel((8, 16))}, 'b': {'kernel': _kernel((8, 16)) * TINY}}
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    jaxprune.pruning(HP).init(normal)
    jaxprune.update_mask(normal['Dense_0']['kernel'], jnp.float32(0), jnp.float32(0.5))
    # One threshold over both: the subnormal leaf holds the smallest weights, which a
    # sort would prune first too.
    jaxprune.pruning(HP, global_pruning=True).init(mixed)
    jax.jit(jaxprune.pruning(HP).init)(mixed)  # traced: nothing to read
  with pytest.warns(UserWarning, match=r'a/kernel .*, b/kernel '):
    jaxprune.pruning(HP, global_pruning=True).init({**mixed, 'a': mixed['b']})
