"""Hyperparameters: TF names and defaults, string parsing, validation errors."""

import ml_collections
import pytest

import jaxprune
from jaxprune import hparams as hparams_lib

TF_DEFAULTS = {
    'name': 'model_pruning', 'begin_pruning_step': 0, 'end_pruning_step': -1,
    'weight_sparsity_map': [''], 'block_dims_map': [''], 'threshold_decay': 0.0,
    'pruning_frequency': 10, 'nbins': 256, 'block_height': 1, 'block_width': 1,
    'block_pooling_function': 'AVG', 'initial_sparsity': 0.0, 'target_sparsity': 0.5,
    'sparsity_function_begin_step': 0, 'sparsity_function_end_step': 100,
    'sparsity_function_exponent': 3.0, 'use_tpu': False,
}


def test_defaults_are_tfs():
  hp = jaxprune.get_pruning_hparams()
  assert isinstance(hp, ml_collections.ConfigDict)
  for name, value in TF_DEFAULTS.items():
    assert hp[name] == value, name
  assert hp.threshold_method == 'histogram'
  assert hp.weight_name_regex == '(kernel|embedding)$'


def test_types_are_fixed_by_defaults():
  hp = jaxprune.get_pruning_hparams()
  with pytest.raises(TypeError):
    hp.nbins = 2.5


def test_parse_tf_string_syntax():
  hp = jaxprune.parse_hparams(
      'target_sparsity=0.9,pruning_frequency=100,'
      'weight_sparsity_map=[conv1:0.8,dense/kernel:0.95],block_dims_map=[dense1:4x4],'
      'use_tpu=true')
  assert hp.target_sparsity == 0.9
  assert hp.pruning_frequency == 100
  assert hp.use_tpu is True
  assert hparams_lib.sparsity_map(hp) == [('conv1', 0.8), ('dense/kernel', 0.95)]
  assert hparams_lib.block_dims_map(hp) == [('dense1', (4, 4))]


def test_parse_on_top_of_base_does_not_modify_it():
  base = jaxprune.parse_hparams('target_sparsity=0.7')
  hp = jaxprune.parse_hparams('nbins=64', base=base)
  assert (hp.target_sparsity, hp.nbins) == (0.7, 64)
  assert base.nbins == 256


def test_map_value_is_after_the_last_colon():
  hp = jaxprune.parse_hparams('weight_sparsity_map=[a:b/kernel:0.3],block_dims_map=[x:y:-1x2]')
  assert hparams_lib.sparsity_map(hp) == [('a:b/kernel', 0.3)]
  assert hparams_lib.block_dims_map(hp) == [('x:y', (-1, 2))]


def test_empty_map_entries_are_dropped():
  hp = jaxprune.parse_hparams('weight_sparsity_map=[]')
  assert hparams_lib.sparsity_map(hp) == []


def test_unknown_name_lists_known_names():
  with pytest.raises(ValueError, match="unknown hyperparameter 'target_sparsty'.*target_sparsity"):
    jaxprune.parse_hparams('target_sparsty=0.9')


@pytest.mark.parametrize('text, field', [
    ('begin_pruning_step=-1', 'begin_pruning_step'),
    ('begin_pruning_step=5,end_pruning_step=5', 'end_pruning_step'),
    ('end_pruning_step=-2', 'end_pruning_step'),
    ('sparsity_function_begin_step=-1', 'sparsity_function_begin_step'),
    ('sparsity_function_begin_step=100', 'sparsity_function_end_step'),
    ('threshold_decay=1.0', 'threshold_decay'),
    ('initial_sparsity=-0.1', 'initial_sparsity'),
    ('target_sparsity=1.0', 'target_sparsity'),
    ('weight_sparsity_map=[conv1:1.2]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[conv1:abc]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[conv1]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[(:0.5]', 'weight_sparsity_map'),
    ('nbins=1', 'nbins'),
    ('pruning_frequency=0', 'pruning_frequency'),
    ('block_height=0', 'block_height'),
    ('block_width=-2', 'block_width'),
    ('block_dims_map=[dense:0x2]', 'block_dims_map'),
    ('block_dims_map=[dense:2]', 'block_dims_map'),
    ('block_pooling_function=MIN', 'block_pooling_function'),
    ('threshold_method=sort', 'threshold_method'),
    ('weight_name_regex=(', 'weight_name_regex'),
    ('nm_sparsity=4:2', 'nm_sparsity'),
    ('nm_sparsity_map=[dense:2]', 'nm_sparsity_map'),
])
def test_each_validation_rule_names_its_field(text, field):
  with pytest.raises(ValueError, match=field):
    jaxprune.parse_hparams(text)


def test_bad_value_type_names_the_field():
  with pytest.raises(ValueError, match='nbins'):
    jaxprune.parse_hparams('nbins=2.5')


def test_pooling_is_case_insensitive():
  assert jaxprune.parse_hparams('block_pooling_function=max').block_pooling_function == 'max'


def test_validation_through_pruning():
  hp = jaxprune.get_pruning_hparams()
  hp.target_sparsity = 1.5
  with pytest.raises(ValueError, match='target_sparsity=1.5'):
    jaxprune.pruning(hp)


def test_global_pruning_rejects_per_variable_targets():
  with pytest.raises(ValueError, match='global_pruning'):
    jaxprune.parse_hparams('global_pruning=true,weight_sparsity_map=[a:0.5]')
