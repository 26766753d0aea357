"""Tests for jaxprune_train._models: layer names and shapes, outputs."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxprune._names import named_leaves
from jaxprune_train import _models as models


def _shapes(params):
  return {name: leaf.shape for name, leaf in named_leaves(params)}


def test_mlp_is_lenet_300_100_on_8x8_inputs():
  config = ml_collections.ConfigDict({'name': 'mlp', 'features': (300, 100)})
  model = models.create_model(config, 10)
  params = models.init_params(model, (8, 8, 1), seed=0)
  assert _shapes(params) == {
    'Dense_0/bias': (300,),
    'Dense_0/kernel': (64, 300),
    'Dense_1/bias': (100,),
    'Dense_1/kernel': (300, 100),
    'Dense_2/bias': (10,),
    'Dense_2/kernel': (100, 10),
  }
  assert model.apply({'params': params}, jnp.ones((5, 8, 8, 1))).shape == (5, 10)


def test_cnn_shapes():
  config = ml_collections.ConfigDict({'name': 'cnn', 'features': (16, 32), 'dense': 64})
  model = models.create_model(config, 7)
  params = models.init_params(model, (8, 8, 1), seed=0)
  # 8x8 -> pool -> 4x4 -> pool -> 2x2, with 32 channels: 128 inputs to Dense_0.
  assert _shapes(params) == {
    'Conv_0/bias': (16,),
    'Conv_0/kernel': (3, 3, 1, 16),
    'Conv_1/bias': (32,),
    'Conv_1/kernel': (3, 3, 16, 32),
    'Dense_0/bias': (64,),
    'Dense_0/kernel': (128, 64),
    'Dense_1/bias': (7,),
    'Dense_1/kernel': (64, 7),
  }
  # Channel-less images are accepted too.
  assert model.apply({'params': params}, jnp.ones((2, 8, 8))).shape == (2, 7)


def test_mlp_matches_a_numpy_forward_pass():
  model = models.MLP(features=(5,), num_classes=3)
  params = models.init_params(model, (4,), seed=1)
  x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
  p = jax.tree.map(np.asarray, params)
  hidden = np.maximum(x @ p['Dense_0']['kernel'] + p['Dense_0']['bias'], 0)
  expected = hidden @ p['Dense_1']['kernel'] + p['Dense_1']['bias']
  np.testing.assert_allclose(model.apply({'params': params}, x), expected, rtol=1e-5, atol=1e-6)


def test_unknown_model():
  with pytest.raises(ValueError, match="model.name='resnet'"):
    models.create_model(ml_collections.ConfigDict({'name': 'resnet'}), 10)
