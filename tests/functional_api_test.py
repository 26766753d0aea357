"""Tests for jaxprune.functional: torch.nn.utils.prune's functions on pytrees."""

import functools

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune
from jaxprune import functional

# The torch pruning tutorial's conv1 (torch layout (out, in, H, W)), the mask that
# prune.random_unstructured(conv1, 'weight', amount=0.3) drew there, and the mask after
# prune.ln_structured(conv1, 'weight', amount=0.5, n=2, dim=0) on top of it.
TUTORIAL_WEIGHT = np.array(
  [
    [[0.2548, 0.2767, -0.0781], [0.3062, -0.0730, 0.0673], [-0.1623, 0.1958, 0.2938]],
    [[-0.2445, 0.2897, 0.0624], [0.2463, 0.0451, 0.1607], [-0.0471, 0.2570, 0.0493]],
    [[-0.1556, 0.0850, -0.1536], [-0.0391, -0.1354, 0.2211], [-0.2631, -0.1537, -0.0941]],
    [[-0.2004, 0.0315, -0.3292], [0.3010, -0.2832, 0.2573], [0.0555, -0.1082, 0.2060]],
    [[0.0520, 0.2693, 0.0364], [-0.1051, 0.0896, -0.0904], [0.1403, 0.2976, 0.1927]],
    [[-0.1457, 0.1924, 0.0596], [0.1693, -0.2032, -0.3300], [-0.1288, -0.2557, 0.2735]],
  ],
  np.float32,
)[:, None]
TUTORIAL_RANDOM_MASK = np.array(
  [
    [[1, 1, 1], [1, 1, 1], [0, 1, 1]],
    [[1, 1, 0], [0, 1, 1], [1, 0, 1]],
    [[1, 1, 1], [0, 0, 1], [1, 1, 1]],
    [[1, 0, 1], [1, 1, 1], [1, 1, 0]],
    [[1, 1, 1], [0, 1, 1], [0, 1, 0]],
    [[0, 1, 0], [1, 1, 1], [0, 0, 0]],
  ],
  bool,
)[:, None]
TUTORIAL_BIAS = np.array([0.0960, 0.1381, 0.1054, -0.0058, 0.2609, -0.2368], np.float32)


def tutorial_params():
  return {'conv1': {'weight': jnp.asarray(TUTORIAL_WEIGHT), 'bias': jnp.asarray(TUTORIAL_BIAS)}}


def mlp_params(seed=0):
  rng = np.random.default_rng(seed)
  return {
    'Dense_0': {
      'kernel': jnp.asarray(rng.normal(size=(8, 6)), jnp.float32),
      'bias': jnp.asarray(rng.normal(size=(6,)), jnp.float32),
    },
    'Dense_1': {
      'kernel': jnp.asarray(0.5 * rng.normal(size=(6, 4)), jnp.float32),
      'bias': jnp.zeros((4,), jnp.float32),
    },
  }


def reference_keep(scores, amount, alive):
  """Ranks alive entries by (|score| desc, index asc) and keeps the first ones."""
  flat = np.abs(np.asarray(scores, np.float64)).reshape(-1)
  alive = np.asarray(alive).reshape(-1)
  idx = [i for i in range(flat.size) if alive[i]]
  n_prune = amount if isinstance(amount, int) else round(amount * len(idx))
  keep = np.zeros(flat.size, bool)
  keep[sorted(idx, key=lambda i: (-flat[i], i))[: len(idx) - n_prune]] = True
  return keep.reshape(np.shape(scores))


@pytest.mark.slow
def test_torch_tutorial_iterative_ln_structured():
  masks = {'conv1': {'weight': jnp.asarray(TUTORIAL_RANDOM_MASK), 'bias': None}}
  masks = functional.ln_structured(
    tutorial_params(), 0.5, n=2, axis=0, names='conv1/weight', masks=masks
  )
  expected = TUTORIAL_RANDOM_MASK.copy()
  expected[[1, 2, 4]] = False  # the tutorial's final weight_mask keeps channels 0, 3, 5
  np.testing.assert_array_equal(masks['conv1']['weight'], expected)
  assert masks['conv1']['bias'] is None


def test_torch_tutorial_bias_and_weight_masks_compose_across_calls():
  params = tutorial_params()
  masks = {'conv1': {'weight': jnp.asarray(TUTORIAL_RANDOM_MASK), 'bias': None}}
  masks = functional.l1_unstructured(params, 3, names='bias', masks=masks)
  np.testing.assert_array_equal(masks['conv1']['bias'], [0, 1, 0, 0, 1, 1])
  np.testing.assert_array_equal(masks['conv1']['weight'], TUTORIAL_RANDOM_MASK)  # untouched
  pruned = functional.remove(params, masks)
  np.testing.assert_array_equal(
    pruned['conv1']['bias'], TUTORIAL_BIAS * np.array([0, 1, 0, 0, 1, 1], np.float32)
  )
  np.testing.assert_array_equal(pruned['conv1']['weight'], TUTORIAL_WEIGHT * TUTORIAL_RANDOM_MASK)


@pytest.mark.slow
def test_default_selection_is_kernels_and_others_are_none():
  params = mlp_params()
  masks = functional.l1_unstructured(params, 0.5)
  assert masks['Dense_0']['bias'] is None and masks['Dense_1']['bias'] is None
  for layer in ('Dense_0', 'Dense_1'):
    kernel = params[layer]['kernel']
    np.testing.assert_array_equal(
      masks[layer]['kernel'], reference_keep(kernel, 0.5, np.ones(kernel.shape, bool))
    )


def test_selection_by_predicate():
  params = mlp_params()
  masks = functional.l1_unstructured(params, 1, names=lambda name, leaf: leaf.ndim == 1)
  assert masks['Dense_0']['kernel'] is None
  assert int(jnp.sum(~masks['Dense_0']['bias'])) == 1
  # Dense_1's bias is all zeros: ties go to the lower index, so the last entry is pruned.
  np.testing.assert_array_equal(masks['Dense_1']['bias'], [1, 1, 1, 0])


def test_selecting_nothing_names_the_leaves():
  with pytest.raises(ValueError, match=r'selects no leaf.*Dense_0/kernel'):
    functional.l1_unstructured(mlp_params(), 0.5, names='conv')


def test_iterative_unstructured_amount_is_relative_to_what_is_left():
  params = mlp_params()
  kernel = np.asarray(params['Dense_0']['kernel'])
  first = functional.l1_unstructured(params, 0.5, names='Dense_0/kernel')
  second = functional.l1_unstructured(params, 0.5, names='Dense_0/kernel', masks=first)
  keep1 = reference_keep(kernel, 0.5, np.ones(kernel.shape, bool))
  keep2 = reference_keep(kernel, 0.5, keep1)
  np.testing.assert_array_equal(second['Dense_0']['kernel'], keep2)
  assert int(keep2.sum()) == 12  # 48 -> 24 -> 12


def test_global_unstructured_matches_concatenated_reference():
  params = mlp_params()
  masks = functional.global_unstructured(params, 0.6)
  k0, k1 = np.asarray(params['Dense_0']['kernel']), np.asarray(params['Dense_1']['kernel'])
  both = np.concatenate([k0.ravel(), k1.ravel()])
  keep = reference_keep(both, 0.6, np.ones(both.shape, bool))
  np.testing.assert_array_equal(masks['Dense_0']['kernel'].ravel(), keep[:48])
  np.testing.assert_array_equal(masks['Dense_1']['kernel'].ravel(), keep[48:])
  assert int(keep.sum()) == 72 - round(0.6 * 72)
  # Dense_1's weights are half as large, so it loses a larger share than Dense_0.
  assert float(jnp.mean(masks['Dense_1']['kernel'])) < float(jnp.mean(masks['Dense_0']['kernel']))


def test_global_unstructured_ties_go_to_the_earlier_leaf():
  params = {'a': {'kernel': jnp.ones((2, 2))}, 'b': {'kernel': jnp.ones((2, 2))}}
  masks = functional.global_unstructured(params, 3)
  np.testing.assert_array_equal(masks['a']['kernel'], [[1, 1], [1, 1]])
  np.testing.assert_array_equal(masks['b']['kernel'], [[1, 0], [0, 0]])


def test_global_unstructured_iterative():
  params = mlp_params()
  first = functional.global_unstructured(params, 0.5)
  second = functional.global_unstructured(params, 0.5, masks=first)
  alive = np.concatenate(
    [np.asarray(first['Dense_0']['kernel']).ravel(), np.asarray(first['Dense_1']['kernel']).ravel()]
  )
  both = np.concatenate(
    [
      np.asarray(params['Dense_0']['kernel']).ravel(),
      np.asarray(params['Dense_1']['kernel']).ravel(),
    ]
  )
  keep = reference_keep(both, 0.5, alive)
  got = np.concatenate(
    [
      np.asarray(second['Dense_0']['kernel']).ravel(),
      np.asarray(second['Dense_1']['kernel']).ravel(),
    ]
  )
  np.testing.assert_array_equal(got, keep)
  assert int(keep.sum()) == 18


def test_importance_scores_replace_magnitudes():
  params = mlp_params()
  scores = jax.tree.map(jnp.ones_like, params)
  # Scores 23, 22, ..., 0 in row-major order: the two lowest sit at the last two entries.
  scores['Dense_1']['kernel'] = -jnp.arange(24.0).reshape(6, 4) + 23
  masks = functional.l1_unstructured(params, 2, names='Dense_1/kernel', scores=scores)
  expected = np.ones((6, 4), bool)
  expected[5, 2:] = False
  np.testing.assert_array_equal(masks['Dense_1']['kernel'], expected)
  with pytest.raises(ValueError, match="scores for leaf 'Dense_1/kernel'"):
    functional.l1_unstructured(
      params, 2, names='Dense_1/kernel', scores=jax.tree.map(lambda x: x[:1], params)
    )


@pytest.mark.slow
def test_random_unstructured_per_leaf():
  params = mlp_params()
  masks = functional.random_unstructured(params, 0.25, key=jax.random.key(0))
  assert int(jnp.sum(~masks['Dense_0']['kernel'])) == 12
  assert int(jnp.sum(~masks['Dense_1']['kernel'])) == 6
  again = functional.random_unstructured(params, 0.25, key=jax.random.key(0))
  np.testing.assert_array_equal(masks['Dense_0']['kernel'], again['Dense_0']['kernel'])
  twin = {'a': {'kernel': jnp.ones((8, 8))}, 'b': {'kernel': jnp.ones((8, 8))}}
  twin_masks = functional.random_unstructured(twin, 0.5, key=jax.random.key(1))
  assert bool(jnp.any(twin_masks['a']['kernel'] != twin_masks['b']['kernel']))


class EveryOther:
  """The tutorial's FooBarPruningMethod: prune every other entry still unpruned."""

  def compute_mask(self, weights, previous_mask):
    alive = previous_mask.reshape(-1)
    rank_among_alive = jnp.cumsum(alive) - 1
    return (alive & (rank_among_alive % 2 == 1)).reshape(weights.shape)


def test_custom_method_protocol_and_iteration():
  params = {'fc3': {'kernel': jnp.ones((3, 10)), 'bias': jnp.ones((10,))}}
  masks = functional.prune(params, EveryOther(), names='fc3/bias')
  np.testing.assert_array_equal(masks['fc3']['bias'], [0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
  masks = functional.prune(params, EveryOther(), names='fc3/bias', masks=masks)
  np.testing.assert_array_equal(masks['fc3']['bias'], [0, 0, 0, 1, 0, 0, 0, 1, 0, 0])


def test_custom_method_cannot_revive_entries_and_sees_masked_weights():
  seen = []

  class KeepAll:
    def compute_mask(self, weights, previous_mask):
      seen.append(np.asarray(weights))
      return jnp.ones(weights.shape, bool)

  params = {'kernel': jnp.arange(1.0, 5.0).reshape(2, 2)}
  previous = {'kernel': jnp.array([[True, False], [False, True]])}
  masks = functional.prune(params, KeepAll(), masks=previous)
  np.testing.assert_array_equal(masks['kernel'], previous['kernel'])
  np.testing.assert_array_equal(seen[0], [[1.0, 0.0], [0.0, 4.0]])


def test_not_a_method_is_a_type_error():
  with pytest.raises(TypeError, match='compute_mask'):
    functional.prune(mlp_params(), lambda w, m: m)


def test_nm_structured_on_a_tree_and_error_names_the_leaf():
  params = mlp_params()
  masks = functional.nm_structured(params, 1, 2)
  for layer in ('Dense_0', 'Dense_1'):
    kernel = np.abs(np.asarray(params[layer]['kernel']))
    expected = np.zeros(kernel.shape, bool)
    for g in range(kernel.shape[0] // 2):
      for j in range(kernel.shape[1]):
        top = 2 * g + (1 if kernel[2 * g + 1, j] > kernel[2 * g, j] else 0)
        expected[top, j] = True
    np.testing.assert_array_equal(masks[layer]['kernel'], expected)
  with pytest.raises(ValueError, match=r"leaf 'Dense_1/kernel'.*axis 0 has 6 entries.*M=4"):
    functional.nm_structured(params, 2, 4)


def test_masks_must_be_parallel_to_params():
  with pytest.raises(ValueError, match='masks must be a tree parallel to params'):
    functional.l1_unstructured(mlp_params(), 0.5, masks={'Dense_0': None})
  params = mlp_params()
  masks = jax.tree.map(lambda x: None, params)
  masks['Dense_0']['kernel'] = jnp.ones((6, 8), bool)  # transposed
  with pytest.raises(ValueError, match=r"masks for leaf 'Dense_0/kernel': expected shape \(8, 6\)"):
    functional.l1_unstructured(params, 0.5, masks=masks)


def test_jit_matches_eager():
  params = mlp_params()
  prune = jax.jit(functools.partial(functional.l1_unstructured, amount=0.3))
  eager = functional.l1_unstructured(params, 0.3)
  jitted = prune(params)
  iterate = jax.jit(lambda p, m: functional.ln_structured(p, 0.5, 2, -1, masks=m))
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(
    jax.tree.leaves(iterate(params, eager)),
    jax.tree.leaves(functional.ln_structured(params, 0.5, 2, -1, masks=eager)),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)
  global_prune = jax.jit(lambda p, m: functional.global_unstructured(p, 0.5, masks=m))
  for a, b in zip(
    jax.tree.leaves(global_prune(params, eager)),
    jax.tree.leaves(functional.global_unstructured(params, 0.5, masks=eager)),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)


def test_remove_keeps_dtype_and_unmasked_leaves():
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), mlp_params())
  masks = functional.l1_unstructured(params, 0.5)
  stripped = functional.remove(params, masks)
  assert stripped['Dense_0']['kernel'].dtype == jnp.bfloat16
  assert int(jnp.sum(stripped['Dense_0']['kernel'] == 0)) == 24
  np.testing.assert_array_equal(stripped['Dense_0']['bias'], params['Dense_0']['bias'])


def test_masks_and_params_serialise_with_flax_msgpack():
  params = mlp_params()
  masks = functional.l1_unstructured(params, 0.5)
  restored = flax.serialization.msgpack_restore(
    flax.serialization.msgpack_serialize({'params': params, 'masks': masks})
  )
  assert restored['masks']['Dense_0']['bias'] is None
  np.testing.assert_array_equal(restored['masks']['Dense_0']['kernel'], masks['Dense_0']['kernel'])
  np.testing.assert_array_equal(
    restored['params']['Dense_1']['kernel'], params['Dense_1']['kernel']
  )
  # The restored (numpy) masks drive another round like the originals.
  again = functional.l1_unstructured(restored['params'], 0.5, masks=restored['masks'])
  direct = functional.l1_unstructured(params, 0.5, masks=masks)
  np.testing.assert_array_equal(again['Dense_1']['kernel'], direct['Dense_1']['kernel'])


@pytest.mark.parametrize('mask', [np.ones((8, 1), bool), np.bool_(True), np.ones((6, 8), bool)])
def test_remove_never_broadcasts_a_mask(mask):
  params = mlp_params()
  with pytest.raises(ValueError) as err:
    functional.remove(
      params, {'Dense_0': {'kernel': mask, 'bias': None}, 'Dense_1': {'kernel': None, 'bias': None}}
    )
  assert str(err.value) == (
    f"the mask of leaf 'Dense_0/kernel' has shape {mask.shape} but the "
    "leaf has shape (8, 6); masks are not broadcast: give the leaf's shape"
  )


def test_remove_strip_and_apply_masks_are_one_rule_also_under_jit():
  params = mlp_params()
  masks = functional.l1_unstructured(params, 0.5)
  expected = jax.tree.map(
    lambda p, m: p if m is None else np.where(m, p, 0), params, masks, is_leaf=lambda x: x is None
  )
  for zero in (functional.remove, jaxprune.strip, jaxprune.apply_masks, jax.jit(functional.remove)):
    for a, b in zip(jax.tree.leaves(zero(params, masks)), jax.tree.leaves(expected), strict=True):
      np.testing.assert_array_equal(a, b)


def test_default_leaves_are_the_transforms_default():
  import inspect

  from jaxprune._config import fields

  for fn in (
    functional.prune,
    functional.l1_unstructured,
    functional.random_unstructured,
    functional.ln_structured,
    functional.nm_structured,
    functional.global_unstructured,
  ):
    assert inspect.signature(fn).parameters['names'].default is fields.DEFAULT_WEIGHT_NAME_REGEX
