"""The shared argument checks (`jaxprune._checks`): the [0, 1) range and the missing params."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune
from jaxprune import _checks as checks
from jaxprune import oneshot, sparse


@pytest.mark.parametrize('value', [0, 0.0, 0.5, 0.999, np.float32(0.25), jnp.array([0.0, 0.9])])
def test_fractions(value):
  assert checks.is_fraction(value)
  checks.check_fraction('sparsity', value)


@pytest.mark.parametrize('value', [1, 1.0, -0.1, float('nan'), True, '0.5', None, [0.5, 1.0]])
def test_not_fractions(value):
  assert not checks.is_fraction(value)
  with pytest.raises(ValueError, match=r'^f: x=.*: must be in \[0, 1\), e.g. 0.9\.$'):
    checks.check_fraction('x', value, where='f', example='0.9')


def test_every_taker_of_a_fraction_gives_the_same_message():
  params = {'Dense_0': {'kernel': jnp.ones((4, 4))}}
  calls = [
    lambda: jaxprune.pruning(target_sparsity=1.0),
    lambda: jaxprune.update_mask(jnp.ones(4), 0.0, 1.0),
    lambda: sparse.densities(params, 1.0),
    lambda: sparse.static(optax.sgd(0.1), 1.0),
    lambda: oneshot.prune(
      lambda p, x: x @ p['w'],
      {'w': jnp.ones((4, 2))},
      [jnp.ones((3, 4))],
      method='wanda',
      sparsity=1.0,
    ),
  ]
  for call in calls:
    with pytest.raises(ValueError, match=r'sparsity=1\.0: must be in \[0, 1\)'):
      call()
  with pytest.raises(ValueError, match=r'drop_fraction=1\.0: must be in \[0, 1\)'):
    sparse.rigl(optax.sgd(0.1), 0.5, end_step=10, drop_fraction=1.0)
  with pytest.raises(ValueError, match=r'weight_sparsity_map entry k:1\.5: sparsity=1\.5: must'):
    jaxprune.pruning(weight_sparsity_map=['k:1.5'])
  with pytest.raises(ValueError, match=r"sparsity_map entry 'k': sparsity=1\.5: must"):
    sparse.densities(params, 0.5, sparsity_map={'k': 1.5})


def test_every_transform_names_itself_when_the_params_are_missing():
  params = {'Dense_0': {'kernel': jnp.ones((4, 4))}}
  transforms = {
    'jaxprune.pruning': jaxprune.pruning(),
    'jaxprune.pruned': jaxprune.pruned(optax.sgd(0.1)),
    'jaxprune.sparse.rigl': sparse.rigl(optax.sgd(0.1), 0.5, end_step=10),
    'jaxprune.sparse.ste': sparse.ste(optax.sgd(0.1), 0.5),
  }
  for what, tx in transforms.items():
    with pytest.raises(ValueError, match=rf'^{what} needs the params: call tx\.update'):
      tx.update(params, tx.init(params))
