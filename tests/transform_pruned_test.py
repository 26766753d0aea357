"""`jaxprune.pruned(optimizer, hparams)` equals `optax.chain(optimizer, pruning(hparams))`.

The wrapping form runs the optimizer, then the chained form's pruning step on its
updates; these tests hold it to the chained form bit for bit (masks, thresholds,
params, optimizer state) over runs with several mask updates, for every rule and
map, and check that the compiled step reads the optimizer state in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune

F32 = np.float32
STEPS = 7  # mask updates at steps 2, 4 and 6


def _params(dtype=F32):
  rng = np.random.default_rng(0)
  tree = {
    'h': {
      'kernel': rng.standard_normal((3, 16, 24)).astype(F32),
      'bias': rng.standard_normal((3, 24)).astype(F32),
    },
    'conv': {'kernel': rng.standard_normal((3, 3, 8, 16)).astype(F32)},
    'head': {'kernel': rng.standard_normal((24, 16)).astype(F32)},
  }
  return jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)


def _grads(params, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)


def _run(tx, params):
  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  history = []
  for t in range(STEPS):
    params, state = step(params, state, _grads(params, t))
    history.append((params, state))
  return history


CASES = {
  'histogram': 'target_sparsity=0.8',
  'exact': 'target_sparsity=0.8,threshold_method=exact',
  'decay': 'target_sparsity=0.8,threshold_decay=0.5',
  'blocks': 'target_sparsity=0.6,block_dims_map=[head:2x4],block_pooling_function=MAX',
  'maps': 'target_sparsity=0.8,weight_sparsity_map=[conv:0.5,head:0.95]',
  'global': 'target_sparsity=0.7,global_pruning=true',
  'nm': 'target_sparsity=0.8,nm_sparsity_map=[head:2:4]',
  'stacked': 'target_sparsity=0.8,layer_axes_map=[h/:1]',
  'params source': 'target_sparsity=0.8,mask_source=params',
}


@pytest.mark.slow
@pytest.mark.parametrize('case', CASES)
def test_pruned_equals_the_chained_form_bit_for_bit(case):
  hparams = jaxprune.parse_hparams(
    f'{CASES[case]},begin_pruning_step=2,pruning_frequency=2,sparsity_function_begin_step=2,'
    'sparsity_function_end_step=6'
  )
  params = _params()
  chained = _run(optax.chain(optax.adam(0.1), jaxprune.pruning(hparams)), params)
  wrapped = _run(jaxprune.pruned(optax.adam(0.1), hparams), params)
  for t, ((p1, s1), (p2, s2)) in enumerate(zip(chained, wrapped, strict=True)):
    # The same state layout: (adam state, PruningState), as optax.chain's.
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2)), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f'step {t}')
  pruning_state = jaxprune.find_pruning_state(wrapped[-1][1])
  assert int(pruning_state.last_update_step) == 6
  kernel = np.asarray(wrapped[-1][0]['head']['kernel'])
  assert np.mean(kernel == 0) >= 0.5


def test_pruned_in_bfloat16_thresholds_the_stored_weights():
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.8,sparsity_function_end_step=2,pruning_frequency=1'
  )
  params = _params(jnp.bfloat16)
  chained = _run(optax.chain(optax.sgd(0.3), jaxprune.pruning(hparams)), params)
  wrapped = _run(jaxprune.pruned(optax.sgd(0.3), hparams), params)
  for a, b in zip(jax.tree.leaves(chained[-1]), jax.tree.leaves(wrapped[-1]), strict=True):
    np.testing.assert_array_equal(np.asarray(a, F32), np.asarray(b, F32))


def test_pruned_works_with_an_optimizer_that_mixes_leaves():
  """clip_by_global_norm reads every gradient, and pruned hands them all to it.

  The masks and thresholds are the chained form's; the params agree to an ulp
  (XLA:CPU may fuse momentum's multiply-add differently in the two programs,
  as it may for the optimizer alone in two different steps).
  """
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.5,sparsity_function_end_step=3,pruning_frequency=1'
  )
  optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(1.0, momentum=0.9))
  params = _params()
  chained = _run(optax.chain(optimizer, jaxprune.pruning(hparams)), params)
  wrapped = _run(jaxprune.pruned(optimizer, hparams), params)
  for (p1, s1), (p2, s2) in zip(chained, wrapped, strict=True):
    m1, m2 = jaxprune.find_pruning_state(s1), jaxprune.find_pruning_state(s2)
    for a, b in zip(
      jax.tree.leaves((m1.masks, m1.thresholds)),
      jax.tree.leaves((m2.masks, m2.thresholds)),
      strict=True,
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=3e-7, atol=0)


@pytest.mark.slow
def test_checkpoints_of_either_form_restore_into_the_other():
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.8,sparsity_function_end_step=4,pruning_frequency=2'
  )
  params = _params()
  chained_tx = optax.chain(optax.adam(0.1), jaxprune.pruning(hparams))
  wrapped_tx = jaxprune.pruned(optax.adam(0.1), hparams)
  state = _run(chained_tx, params)[2][1]
  restored = jax.tree.unflatten(jax.tree.structure(wrapped_tx.init(params)), jax.tree.leaves(state))
  grads = _grads(params, 9)
  a = chained_tx.update(grads, state, params)
  b = wrapped_tx.update(grads, restored, params)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_step_reads_the_optimizer_state_in_place():
  """No copy of Adam's moments, and no temporary of the params' size outside the update.

  The chained form keeps the updates in a buffer of their own (its conditional
  reads them); the wrapping form's only large temporary is the stored weights
  inside the mask update's branch.
  """
  hparams = jaxprune.parse_hparams('target_sparsity=0.8')
  params = {'a': {'kernel': jnp.ones((256, 512))}, 'b': {'kernel': jnp.ones((512, 256))}}
  grads = jax.tree.map(jnp.ones_like, params)

  def compiled(tx):
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), grads).compile()

  wrapped = compiled(jaxprune.pruned(optax.adam(1e-3), hparams))
  copies = [
    line
    for line in wrapped.as_text().splitlines()
    if ' copy(' in line and ('f32[256,512]' in line or 'f32[512,256]' in line)
  ]
  assert copies == []
  nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
  chained = compiled(optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams)))
  assert chained.memory_analysis().temp_size_in_bytes >= nbytes
  # The stored weights, and a byte per weight for the moved-weights check (its flags and
  # the new masks, written apart from the old ones it reads).
  mask_bytes = sum(x.size for x in jax.tree.leaves(params))
  assert wrapped.memory_analysis().temp_size_in_bytes <= 1.1 * nbytes + 2 * mask_bytes


def test_pruned_needs_the_params():
  tx = jaxprune.pruned(optax.sgd(0.1), jaxprune.parse_hparams('target_sparsity=0.5'))
  params = _params()
  with pytest.raises(ValueError, match='jaxprune.pruned needs the params'):
    tx.update(params, tx.init(params))


def test_multisteps_around_pruning_counts_optimizer_steps():
  """The gradient-accumulation recipe: the schedule counts optimizer steps and pruned weights
  stay zero through the micro-steps.

  See docs/explanation/semantics.md#order-in-an-optax-chain.
  """
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.5,sparsity_function_end_step=2,pruning_frequency=1'
  )
  params = _params()
  tx = optax.MultiSteps(jaxprune.pruned(optax.sgd(0.1), hparams), every_k_schedule=3)
  state = tx.init(params)
  step = jax.jit(lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  for t in range(9):
    params, state = step(params, state, _grads(params, t))
  pruning_state = jaxprune.find_pruning_state(state)
  assert int(pruning_state.step) == 3
  for mask, leaf in zip(
    jax.tree.leaves(pruning_state.masks),
    jax.tree.leaves(
      {'conv': params['conv'], 'h': {'kernel': params['h']['kernel']}, 'head': params['head']}
    ),
    strict=True,
  ):
    assert np.all(np.asarray(leaf)[~np.asarray(mask)] == 0)
    assert 0.4 <= np.mean(~np.asarray(mask)) <= 0.6


@pytest.mark.slow
def test_pruned_hands_extra_arguments_to_the_optimizer():
  """optax's `update(..., **extra_args)`: reduce_on_plateau reads `value`, the loss, and
  scales the updates down as it changes; `pruned` gives what the optimizer alone gives
  (no mask update in these steps)."""
  params = {'Dense_0': {'kernel': jnp.ones((4, 4))}}
  inner = optax.chain(optax.sgd(1.0), optax.contrib.reduce_on_plateau(patience=0, factor=0.5))
  tx = jaxprune.pruned(inner, target_sparsity=0.5)
  assert isinstance(tx, optax.GradientTransformationExtraArgs)
  state, inner_state = tx.init(params), inner.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  scales = []
  for loss in (1.0, 2.0, 0.5, 4.0):
    updates, state = tx.update(grads, state, params, value=jnp.float32(loss))
    expected, inner_state = inner.update(grads, inner_state, params, value=jnp.float32(loss))
    np.testing.assert_array_equal(updates['Dense_0']['kernel'], expected['Dense_0']['kernel'])
    scales.append(float(-updates['Dense_0']['kernel'][0, 0]))
  assert scales[-1] < scales[0]  # the loss reached the plateau rule


def test_version_is_the_packages():
  import importlib.metadata

  assert jaxprune.__version__ == importlib.metadata.version('jaxprune')
