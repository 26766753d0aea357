"""Which leaves are pruned, and each one's target, blocks and layer axes.

See docs/explanation/semantics.md#names-and-maps.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pruning_helpers as helpers
import pytest
import tiny_models

import jaxprune
from jaxprune._config import specs as specs


def test_a_regex_that_matches_no_weight_warns_with_the_leaf_names():
  # Before: 'weight$' (PyTorch's name) on Flax params pruned nothing without a word.
  tx = jaxprune.pruning(jaxprune.parse_hparams('weight_name_regex=weight$'))
  (message,) = helpers.warnings_of(lambda: tx.init(tiny_models.mlp_params()))
  assert "weight_name_regex='weight$' (matched with re.search) selects none" in message
  assert "['Dense_0/kernel', 'Dense_1/kernel']" in message


def test_a_filter_that_selects_nothing_warns():
  tx = jaxprune.pruning(jaxprune.get_pruning_hparams(), prune_filter=lambda name, leaf: False)
  (message,) = helpers.warnings_of(lambda: tx.init(tiny_models.mlp_params()))
  assert 'prune_filter selects none' in message


def test_default_regex_and_vector_only_trees_do_not_warn():
  tx = jaxprune.pruning(jaxprune.get_pruning_hparams())
  assert helpers.warnings_of(lambda: tx.init(tiny_models.mlp_params())) == []
  vectors = {'bias': jnp.ones(3)}
  assert (
    helpers.warnings_of(lambda: jaxprune.pruning(jaxprune.get_pruning_hparams()).init(vectors))
    == []
  )


def test_layer_axes_on_unstacked_kernels_are_refused():
  # Before: '.*:1' on 2-D kernels silently gave each row its own threshold.
  tx = jaxprune.pruning(jaxprune.parse_hparams('layer_axes_map=[.*:1]'))
  with pytest.raises(
    ValueError,
    match=r"layer_axes_map: leaf 'Dense_0/kernel' of shape \(4, 8\) "
    r'has 1 axes left after its 1 layer axes',
  ):
    tx.init(tiny_models.mlp_params())


def test_layer_axes_on_a_scanned_stack_give_each_layer_its_spec():
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return nn.Dense(4)(x), None

  stack = nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True}, length=3)
  params = stack().init(jax.random.key(0), jnp.ones((1, 4)), None)['params']
  hp = jaxprune.parse_hparams('layer_axes_map=[Dense_0/kernel:1],block_dims_map=[kernel:2x-1]')
  (leaf,) = [s for s in specs.spec_leaves(specs.leaf_specs(params, hp)) if s is not None]
  assert (leaf.name, leaf.layer_axes, leaf.block_dims) == ('Dense_0/kernel', 1, (2, 4))


def test_a_prune_filter_may_prune_stacked_vectors():
  params = {'b': jnp.ones((3, 5))}
  hp = jaxprune.parse_hparams('layer_axes_map=[b:1]')
  (leaf,) = specs.spec_leaves(specs.leaf_specs(params, hp, lambda name, x: True))
  assert leaf.layer_axes == 1
  with pytest.raises(ValueError, match='0 axes left'):
    specs.leaf_specs({'b': jnp.ones((3,))}, hp, lambda name, x: True)


def test_per_leaf_values_come_from_the_one_matching_entry():
  hp = jaxprune.parse_hparams(
    'target_sparsity=0.5,weight_sparsity_map=[Dense_1:0.8],nm_sparsity_map=[Dense_0/kernel:2:4]'
  )
  first, second = [
    s for s in specs.spec_leaves(specs.leaf_specs(tiny_models.mlp_params(), hp)) if s is not None
  ]
  assert (first.name, first.target, first.nm) == ('Dense_0/kernel', 0.5, (2, 4))
  assert (second.name, second.target, second.nm) == ('Dense_1/kernel', 0.8, None)
  overlapping = jaxprune.parse_hparams('weight_sparsity_map=[Dense:0.8,kernel:0.9]')
  with pytest.raises(ValueError, match="leaf 'Dense_0/kernel' matches several entries"):
    specs.leaf_specs(tiny_models.mlp_params(), overlapping)


def test_unmatched_map_entry_warns_with_unpruned_leaves_present():
  params = {'Dense_0': {'kernel': jnp.ones((4, 4)), 'bias': jnp.ones(4)}}
  hparams = helpers.hparams(weight_sparsity_map=['no_such:0.5'], block_dims_map=['nothing:2x2'])
  with pytest.warns(UserWarning) as record:
    jaxprune.pruning(hparams).init(params)
  message = str(record[0].message)
  assert "weight_sparsity_map entry 'no_such'" in message
  assert "block_dims_map entry 'nothing'" in message
  assert "['Dense_0/kernel']" in message


def test_blocks_on_a_conv_kernel_warn_naming_the_leaf():
  params = {'Conv_0': {'kernel': jnp.ones((3, 3, 4, 8))}, 'Dense_0': {'kernel': jnp.ones((8, 4))}}
  with pytest.warns(UserWarning, match=r"elementwise masks: \['Conv_0/kernel \(3, 3, 4, 8\)'\]"):
    jaxprune.pruning(helpers.hparams(block_height=2, block_width=2)).init(params)


def test_zero_size_leaf_is_not_pruned():
  params = {'empty': {'kernel': jnp.ones((0, 5))}, 'd': {'kernel': jnp.arange(16.0).reshape(4, 4)}}
  tx = jaxprune.pruning(helpers.hparams(threshold_method='exact', **helpers.ONE_SHOT))
  state = helpers.run_updates(tx, params, 2)
  assert state.masks['empty']['kernel'] is None
  assert int(state.masks['d']['kernel'].sum()) == 8


@pytest.mark.parametrize('dtype', [jnp.bool_, jnp.int32, jnp.complex64])
def test_non_real_float_leaf_names_the_leaf(dtype):
  params = {'odd': {'kernel': jnp.ones((4, 4), dtype)}}
  with pytest.raises(ValueError, match=f"leaf 'odd/kernel' has dtype {np.dtype(dtype)}"):
    jaxprune.pruning(helpers.hparams()).init(params)


def test_leaf_filter_is_the_one_selector():
  params = {
    'Dense_0': {'kernel': jnp.ones((4, 3)), 'bias': jnp.ones(3)},
    'Embed_0': {'embedding': jax.ShapeDtypeStruct((5, 2), jnp.float32)},
    'empty': {'kernel': jnp.ones((0, 3))},
    'scale': {'kernel': 2.0},
  }
  named = jaxprune.named_leaves(params)

  def picked(chooser):
    return [name for name, leaf in named if chooser(name, leaf)]

  # A regex: re.search on the name, 2 or more axes, some elements.
  assert picked(specs.leaf_filter('(kernel|embedding)$')) == [
    'Dense_0/kernel',
    'Embed_0/embedding',
  ]
  # functional's: a regex names vectors and scalars too, never empty leaves or None.
  assert picked(specs.leaf_filter('Dense_0|scale', min_ndim=0)) == [
    'Dense_0/bias',
    'Dense_0/kernel',
    'scale/kernel',
  ]
  assert not specs.leaf_filter('.', min_ndim=0)('x', None)
  # A predicate replaces the regex and the axes rule, not the one about elements.
  assert picked(specs.leaf_filter(lambda name, leaf: 'e' in name)) == [
    'Dense_0/bias',
    'Dense_0/kernel',
    'Embed_0/embedding',
    'scale/kernel',
  ]
  with pytest.raises(ValueError, match=r"names: invalid regex '\('"):
    specs.leaf_filter('(', field='names')
  with pytest.raises(TypeError, match='expected a regex string or a predicate'):
    specs.leaf_filter(3)


def test_pruning_sparse_and_functional_select_with_leaf_filter():
  params = {
    'Dense_0': {'kernel': jnp.ones((4, 3)), 'bias': jnp.ones(3)},
    'empty': {'kernel': jnp.ones((0, 3))},
  }
  masks = jaxprune.pruning().init(params).masks
  assert [name for name, _ in jaxprune.named_leaves(masks)] == ['Dense_0/kernel']
  assert jaxprune.sparse.sparse_names(params) == ['Dense_0/kernel']
  masks = jaxprune.functional.l1_unstructured(params, 1, names='Dense_0|empty')
  assert masks['empty']['kernel'] is None  # nothing to prune
  assert masks['Dense_0']['bias'].shape == (3,)  # a regex names a bias as torch does
