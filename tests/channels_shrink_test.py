"""The transform-to-shrink path on the structured zoo: the shrunk model computes the masked one.

Each model is pruned by the transform (one mask update at 50% of the channels
of every group), then `jaxprune.channels.shrink` cuts the masked channels out.
The expected outputs come from the model's own function on variables masked
here by hand, and the expected shapes from counting channels by hand.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from structured_zoo import ZOO

import jaxprune
from jaxprune._names import named_leaves
from jaxprune.channels import ChannelRule
from jaxprune.structured import Constraint, trace

# Kept channels: max(round(n / 2), 1), half to even
# (docs/explanation/semantics.md#exact-thresholds).
# BatchNorm (resnet_identity), residual partners, concat and Flax NNX; the other zoo
# models are left to structured_shrink_zoo_test (each case here costs a compilation).
SHAPES = {
  # The identity shortcut ties the stem's channels to the block's output.
  'resnet_identity': {
    'params/stem/kernel': (3, 3, 3, 4),
    'params/block/conv1/kernel': (3, 3, 4, 4),
    'params/block/conv2/kernel': (3, 3, 4, 4),
    'params/head/kernel': (4, 3),
  },
  # conv_c sees [a, b]: 2 + 3 kept inputs; its own 5 outputs keep round(2.5) = 2.
  'concat': {
    'params/conv_a/kernel': (3, 3, 3, 2),
    'params/conv_b/kernel': (3, 3, 2, 3),
    'params/conv_c/kernel': (1, 1, 5, 2),
    'params/head/kernel': (2, 3),
  },
  # 7 features keep round(3.5) = 4.
  'nnx_model': {'fc1/kernel': (5, 4), 'bn/scale': (4,), 'bn/mean': (4,), 'fc2/kernel': (4, 3)},
}


def _masked(params, masks):
  return jax.tree.map(
    lambda m, p: p if m is None else jnp.where(m, p, 0), masks, params, is_leaf=lambda x: x is None
  )


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(SHAPES))
def test_transform_then_shrink_gives_the_masked_outputs(name):
  fn, variables, args, _ = ZOO[name]()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = trace(fn, variables, *args)
  rule = ChannelRule(graph, constraint=Constraint(round_to=1))
  hparams = jaxprune.get_pruning_hparams()
  hparams.update({'pruning_frequency': 1, 'threshold_method': 'exact'})
  tx = optax.chain(
    optax.sgd(0.1), jaxprune.pruning(hparams, sparsity_fn=lambda t: 0.5, mask_rule=rule)
  )
  key = rule.params_key
  params = variables[key] if key else variables
  state = tx.init(params)
  step = jax.jit(tx.update)
  grads = jax.tree.map(jnp.ones_like, params)  # the weights move: masks follow the params
  for _ in range(2):  # step 0 trains, step 1 updates the masks
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
  trained = {**variables, key: params} if key else params

  result = jaxprune.channels.shrink(rule, trained, state, *args)

  # The transform's params are the masked model: its pruned entries are zero.
  masked = _masked(params, jaxprune.get_masks(state))
  assert all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(masked), jax.tree.leaves(params), strict=True)
  )
  with jax.default_matmul_precision('highest'):  # float32 products on any backend
    expected = fn(trained, *args)
    got = result.pruned_fn(result.variables, *args)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  shapes = {n: tuple(x.shape) for n, x in named_leaves(result.variables)}
  assert {n: shapes[n] for n in SHAPES[name]} == SHAPES[name]
  assert result.check is not None and result.check.ok
  assert result.flops_after < result.flops_before


def test_shrink_of_an_untrained_state_removes_nothing():
  fn, variables, args, _ = ZOO['mlp']()
  graph = trace(fn, variables, *args)
  rule = ChannelRule(graph)
  state = jaxprune.pruning(jaxprune.get_pruning_hparams(), mask_rule=rule).init(variables['params'])
  result = jaxprune.channels.shrink(rule, variables, state, *args)
  assert result.plan.num_removed == 0 and result.flops_kept == 1.0
  np.testing.assert_allclose(
    result.pruned_fn(result.variables, *args), fn(variables, *args), rtol=1e-6
  )


def _mlp_rule_and_state():
  fn, variables, args, _ = ZOO['mlp']()  # 10 -> fc1 16 -> fc2 8 -> fc3 4, batch 2
  rule = ChannelRule(trace(fn, variables, *args), constraint=Constraint(round_to=1))
  state = jaxprune.pruning(jaxprune.get_pruning_hparams(), mask_rule=rule).init(variables['params'])
  return fn, variables, args, rule, state


def _with_masks(state, edit):
  masks = jax.tree.map(np.array, jaxprune.get_masks(state))
  edit(masks)
  return state._replace(masks=jax.tree.map(jnp.asarray, masks))


def _drop_channels(masks):
  """fc1 keeps units 0-7 of 16, fc2 units 0-3 of 8: whole channels, by hand."""
  masks['fc1']['kernel'][:, 8:] = masks['fc1']['bias'][8:] = False
  masks['fc2']['kernel'][8:] = masks['fc2']['kernel'][:, 4:] = masks['fc2']['bias'][4:] = False
  masks['fc3']['kernel'][4:] = False


def test_flops_kept_is_after_over_before_and_the_summary_says_how_many_fewer():
  fn, variables, args, rule, state = _mlp_rule_and_state()
  result = jaxprune.channels.shrink(rule, variables, _with_masks(state, _drop_channels), *args)
  # By hand, batch 2, 2 FLOPs per multiply-add: 4 * (10*16 + 16*8 + 8*4) = 1280 dense,
  # 4 * (10*8 + 8*4 + 4*4) = 512 shrunk: 40% kept, 2.5x fewer.
  assert (result.flops_before, result.flops_after) == (1280, 512)
  assert result.flops_kept == pytest.approx(0.4)
  # the plan, the FLOPs, then the two checks (exactness, distance from the dense model)
  lines = result.summary().splitlines()
  assert lines[3] == 'FLOPs 1.28e+03 -> 512 (40.0% kept, 2.50x fewer)'
  assert lines[4].startswith('exactness check against the masked model')
  assert lines[5].startswith('vs the dense model on the example inputs (2 examples)')


def test_shrink_refuses_masks_that_are_not_whole_channels():
  fn, variables, args, rule, state = _mlp_rule_and_state()

  def one_weight(masks):  # one weight of fc2, not a whole channel
    _drop_channels(masks)
    masks['fc2']['kernel'][0, 0] = False

  with pytest.raises(ValueError, match="the mask of 'fc2/kernel' is not made of whole channels"):
    jaxprune.channels.shrink(rule, variables, _with_masks(state, one_weight), *args)
