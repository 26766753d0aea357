"""`jaxprune.WeightReader`: what a `MaskRule` is handed for each pruned leaf, read with
public names only (`reader()`, `WeightReader.of`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxprune

PARAMS = {'Dense_0': {'kernel': jnp.asarray([[1.0, 2.0], [3.0, 4.0]])}}
UPDATES = {'Dense_0': {'kernel': jnp.asarray([[10.0, 20.0], [30.0, 40.0]])}}


def test_a_reader_of_an_array_reads_it_in_any_pass():
  x = jnp.asarray([1.0, -2.0, 3.0])
  reader = jaxprune.WeightReader.of(x)
  np.testing.assert_array_equal(reader(), x)
  np.testing.assert_array_equal(reader(jnp.int32(3)), x)
  # Each read goes through an optimization barrier tied to its pass.
  jaxpr = jax.make_jaxpr(lambda x, k: jaxprune.WeightReader.of(x)(k))(x, jnp.int32(0))
  assert [e.primitive.name for e in jaxpr.eqns] == ['optimization_barrier']


class _KeepLargerThanThree:
  """A MaskRule written with public names only: keeps the weights above 3."""

  def __init__(self):
    self.seen = []

  def check(self, hparams):
    del hparams

  def init(self, params):
    masks = jax.tree.map(lambda x: jnp.ones(x.shape, bool), params)
    return masks, {'rule': jnp.zeros((), jnp.float32)}

  def new_masks(self, hparams, weights, old_masks, thresholds, sparsity):
    del hparams, old_masks, sparsity
    self.seen = [type(w) for w in weights]
    return [jnp.abs(w()) > 3.0 for w in weights], thresholds, jnp.int32(0)


def _masks_after_an_update(hparams, rule, updates=UPDATES):
  # The first mask update is at step max(begin_pruning_step, pruning_frequency) = 1.
  tx = jaxprune.pruning(hparams, mask_rule=rule)
  state = tx.init(PARAMS)
  for _ in range(2):
    new_updates, state = tx.update(updates, state, PARAMS)
  return jaxprune.get_masks(state)['Dense_0']['kernel'].tolist(), new_updates


def test_a_mask_rule_reads_the_updated_weights_through_readers():
  rule = _KeepLargerThanThree()
  # TF's order: the masks threshold params + updates, 11 22 / 33 44, all above 3.
  masks, _ = _masks_after_an_update('pruning_frequency=1', rule)
  assert rule.seen == [jaxprune.WeightReader]
  assert masks == [[True, True], [True, True]]
  # From the params alone (mask_source='params'): 1 2 / 3 4, only 4 is above 3.
  masks, _ = _masks_after_an_update('pruning_frequency=1,mask_source=params', rule)
  assert masks == [[False, False], [False, True]]


def test_what_the_rule_prunes_lands_on_zero():
  # params + updates = 1 2 / 3 4 halved: 0.5 1 / 1.5 2, none above 3, so all are pruned
  # and the updates are -params.
  halve = {'Dense_0': {'kernel': -PARAMS['Dense_0']['kernel'] * 0.5}}
  masks, updates = _masks_after_an_update('pruning_frequency=1', _KeepLargerThanThree(), halve)
  assert masks == [[False, False], [False, False]]
  new = optax.apply_updates(PARAMS, updates)
  assert new['Dense_0']['kernel'].tolist() == [[0.0, 0.0], [0.0, 0.0]]
