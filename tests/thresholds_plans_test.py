"""The two search plans (hparam `mask_search`): the same thresholds, masks and params, bit for
bit; the accelerator plan's compiled step holds no control flow per leaf; exact at LLM sizes."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from fractions import Fraction

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references

import jaxprune
from jaxprune._search import thresholds as thresholds

F32 = np.float32
PLANS = ('adaptive', 'fixed')


def _weights(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
  if kind == 'normal':
    w = rng.standard_normal(shape)
  elif kind == 'integers':  # many ties, values on bin edges
    w = rng.integers(-5, 6, shape).astype(float)
  elif kind == 'linspace':
    w = np.linspace(1, 100, int(np.prod(shape))).reshape(shape)
  elif kind == 'wide':  # magnitudes over 25 decades: answers far below the maximum
    w = rng.standard_normal(shape) * np.exp(rng.uniform(-60, 0, shape))
  else:  # 'outlier': one weight 10**6 times the rest
    w = rng.standard_normal(shape)
    w.flat[0] = 1e6
  return w.astype(F32)


@functools.cache
def _jitted(method, nbins, plan):
  return jax.jit(
    lambda w, s: jaxprune.update_mask(
      w, 0.0, s, threshold_method=method, nbins=nbins, mask_search=plan
    )
  )


def _update(w, sparsity, method, nbins, plan):
  return _jitted(method, nbins, plan)(w, F32(sparsity))


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['normal', 'integers', 'linspace', 'wide', 'outlier'])
@pytest.mark.parametrize(
  'method, nbins', [('histogram', 256), ('histogram', 7), ('histogram', 100_000), ('exact', 256)]
)
def test_update_mask_is_the_reference_on_both_plans(kind, method, nbins):
  rng = np.random.default_rng(len(kind) * 7 + nbins)
  for shape in [(10, 10), (1024, 96)]:
    w = _weights(kind, shape, rng)
    for sparsity in (0.0, 0.1, 0.5, 0.9, 0.999):
      expected_threshold, expected_mask = references.threshold_and_mask(
        np.abs(w), sparsity, nbins, method
      )
      for plan in PLANS:
        threshold, mask = _update(w, sparsity, method, nbins, plan)
        assert float(threshold) == float(expected_threshold), (plan, shape, sparsity)
        np.testing.assert_array_equal(mask, expected_mask)


def _params(rng, stacked=False):
  layers = [
    {
      'attn': {'kernel': (scale * rng.standard_normal((16, 24))).astype(F32)},
      'mlp': {
        'kernel': (scale * rng.standard_normal((24, 32))).astype(F32),
        'bias': rng.standard_normal(32).astype(F32),
      },
    }
    for scale in (0.5, 1.0, 2.0)
  ]
  head = {'kernel': rng.standard_normal((32, 10)).astype(F32)}
  if stacked:
    return {'h': jax.tree.map(lambda *xs: np.stack(xs), *layers), 'head': head}
  return {'h': {str(i): layer for i, layer in enumerate(layers)}, 'head': head}


CONFIGS = {
  'histogram': {},
  'exact': {'threshold_method': 'exact'},
  'decay': {'threshold_decay': 0.5},
  'blocks': {'block_dims_map': ['mlp/kernel:4x2'], 'block_pooling_function': 'MAX'},
  'maps': {'weight_sparsity_map': ['attn:0.6', 'mlp:0.8'], 'nbins': 64},
  'global': {'global_pruning': True},
  'global_exact': {'global_pruning': True, 'threshold_method': 'exact'},
  'nm': {'nm_sparsity_map': ['attn/kernel:2:4']},
  'stacked': {'layer_axes_map': ['h/.*kernel:1']},
  'stacked_exact': {'layer_axes_map': ['h/.*kernel:1'], 'threshold_method': 'exact'},
  'params_source': {'mask_source': 'params'},
}


def _train(overrides, plan, form, steps=6):
  rng = np.random.default_rng(0)
  params = jax.tree.map(jnp.asarray, _params(rng, stacked='layer_axes_map' in overrides))
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(
    dict(
      pruning_frequency=2,
      sparsity_function_end_step=4,
      target_sparsity=0.7,
      mask_search=plan,
      **overrides,
    )
  )
  if form == 'pruned':
    tx = jaxprune.pruned(optax.adam(0.05), hparams)
  else:
    tx = optax.chain(optax.adam(0.05), jaxprune.pruning(hparams))
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    params, state = step(params, state, grads)
  pruning_state = jaxprune.find_pruning_state(state)
  return params, pruning_state.masks, pruning_state.thresholds


# Each config trains once per plan, the two plans in the two forms (which
# transform_pruned_test finds equal bit for bit), each plan in each form every other config.
_FORMS = {
  config: ('chained', 'pruned') if at % 2 else ('pruned', 'chained')
  for at, config in enumerate(sorted(CONFIGS))
}


@pytest.mark.slow
@pytest.mark.parametrize('config', sorted(CONFIGS))
def test_training_gives_the_same_bits_on_both_plans(config):
  adaptive_form, fixed_form = _FORMS[config]
  adaptive = _train(CONFIGS[config], 'adaptive', adaptive_form)
  fixed = _train(CONFIGS[config], 'fixed', fixed_form)
  for a, b in zip(jax.tree.leaves(adaptive), jax.tree.leaves(fixed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  masks = [m for m in jax.tree.leaves(fixed[1]) if m.dtype == bool]
  assert any(not bool(np.all(m)) for m in masks)  # something was pruned


@pytest.mark.slow
def test_a_pooled_leaf_shaped_like_another_is_not_stacked_with_it():
  """b's 2x2 blocks pool its (16, 16) to (8, 8), a's shape: the fixed plan stacks leaves of
  one shape, and must not put raw weights and pooled scores in one stack."""
  rng = np.random.default_rng(0)
  params = {
    'a': {'kernel': jnp.asarray(rng.standard_normal((8, 8)), jnp.float32)},
    'b': {'kernel': jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)},
  }
  masks = {}
  for plan in PLANS:
    tx = jaxprune.pruned(
      optax.sgd(0.0),
      target_sparsity=0.5,
      pruning_frequency=1,
      sparsity_function_end_step=1,
      block_dims_map=['b/kernel:2x2'],
      mask_search=plan,
    )
    state = tx.init(params)
    for _ in range(2):
      _, state = jax.jit(tx.update)(params, state, params)
    masks[plan] = jax.tree.leaves(state[1].masks)
  for a, b in zip(masks['adaptive'], masks['fixed'], strict=True):
    np.testing.assert_array_equal(a, b)
  a = np.abs(np.asarray(params['a']['kernel']))
  pooled = np.abs(np.asarray(params['b']['kernel'])).reshape(8, 2, 8, 2).mean(axis=(1, 3))
  kept = [
    int(references.threshold_and_mask(a, 0.5, 256, 'histogram')[1].sum()),
    4 * int(references.threshold_and_mask(pooled.astype(F32), 0.5, 256, 'histogram')[1].sum()),
  ]
  assert [int(m.sum()) for m in masks['fixed']] == kept


def _control_flow(form, leaves, overrides):
  """(conditionals, while loops) in the compiled update step of `leaves` pruned leaves."""
  params = {
    f'layer_{i}': {'kernel': jnp.ones((8 + i, 16)), 'bias': jnp.ones(16)} for i in range(leaves)
  }
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(dict(mask_search='fixed', **overrides))
  if form == 'chained':
    tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams))
  else:
    hparams.mask_source = 'params' if form == 'pruned_params' else 'updated'
    tx = jaxprune.pruned(optax.adam(1e-3), hparams)
  state = tx.init(params)
  text = jax.jit(tx.update).lower(params, state, params).compile().as_text()
  return len(re.findall(r' conditional\(', text)), len(re.findall(r' while\(', text))


@pytest.mark.slow
@pytest.mark.parametrize(
  'overrides',
  [
    {},
    {'threshold_method': 'exact'},
    {'global_pruning': True},
    {'block_dims_map': ['layer_1:2x2']},
    {'nm_sparsity_map': ['layer_0:2:4']},
  ],
  ids=['histogram', 'exact', 'global', 'blocks', 'nm'],
)
@pytest.mark.parametrize('form', ['chained', 'pruned', 'pruned_params'])
def test_fixed_plan_step_holds_at_most_four_conditionals_and_loops(form, overrides):
  """On a GPU every conditional and loop iteration waits for the device: the accelerator
  plan's step holds one conditional (is this a mask-update step?) for the histogram rule,
  and for the exact rule also the loop that finishes unusual searches and the rare search
  below 2**-100 of the maximum (a conditional holding a loop), whatever the leaf count."""
  few, many = _control_flow(form, 2, overrides), _control_flow(form, 12, overrides)
  assert few == many
  assert sum(few) <= 4
  if overrides.get('threshold_method') != 'exact':
    assert few == (1, 0)


_SHARDED = """
import jax, jax.numpy as jnp, numpy as np, optax, jaxprune
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4, 2), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
params = {f'l{i}': {'kernel': rng.standard_normal((64, 32)).astype(np.float32)} for i in range(3)}
params['emb'] = {'embedding': rng.standard_normal((128, 32)).astype(np.float32)}
specs = {'l0': {'kernel': P('data', 'model')}, 'l1': {'kernel': P('model', None)},
         'l2': {'kernel': P(None, 'data')}, 'emb': {'embedding': P('data', None)}}
results = {}
for plan in ('adaptive', 'fixed'):
  for method in ('histogram', 'exact'):
    p = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)
    tx = jaxprune.pruned(optax.adam(0.1), 'target_sparsity=0.8,pruning_frequency=1,'
                         f'sparsity_function_end_step=2,mask_search={plan},'
                         f'threshold_method={method}')
    state = tx.init(p)
    step = jax.jit(lambda p, s: (lambda u, s: (optax.apply_updates(p, u), s))(
        *tx.update(jax.tree.map(lambda x: 0.1 * x, p), s, p)))
    for _ in range(4):
      p, state = step(p, state)
    assert p['l0']['kernel'].sharding.spec == P('data', 'model')
    results[plan, method] = [np.asarray(x) for x in jax.tree.leaves((p, state[1].masks))]
for method in ('histogram', 'exact'):
  for a, b in zip(results['adaptive', method], results['fixed', method], strict=True):
    np.testing.assert_array_equal(a, b)
print('ok')
"""


@pytest.mark.slow
def test_plans_agree_on_sharded_params():
  """Leaves sharded along different axes are stacked by the fixed plan: the same bits, and
  the params keep their shardings (8 simulated CPU devices)."""
  result = subprocess.run(
    [sys.executable, '-c', _SHARDED],
    capture_output=True,
    text=True,
    env=cpu_devices.env(8),
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('ok')


def _keep_count_reference(total, sparsity):
  return max(round(Fraction(total) * (1 - Fraction(float(F32(sparsity))))), 1)


def test_exact_keep_count_is_exact_for_every_size():
  """k = round(N (1 - s)), half to even, for the float32 s, up to 2**31 - 1 weights.

  tfmot's float32 product is off by one weight or more for most N above 2**24."""
  rng = np.random.default_rng(0)
  totals = np.concatenate(
    [
      rng.integers(1, 2**31 - 1, 400),
      rng.integers(1, 2**26, 400),
      [13, 11, 3, 5, 2**31 - 1, 2**24 - 3, 2**25 + 1, 1, 7],
    ]
  )
  sparsities = np.concatenate(
    [
      rng.random(400),
      10.0 ** -rng.uniform(0, 40, 400),
      [0.5, 0.5, 0.5, 0.5, 0.5, 0.1, 0.9, 0.0, 0.0],
    ]
  ).astype(F32)
  got = np.asarray(jax.jit(lambda s: thresholds.exact_keep_count(totals, s))(sparsities))
  expected = [_keep_count_reference(int(n), s) for n, s in zip(totals, sparsities, strict=True)]
  np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
  'shape', [(2**24 - 3,), (2**24 - 3, 1), (2**25 + 1,), (753, 44_561)], ids=str
)
def test_exact_rule_is_a_sort_at_llm_sizes(shape):
  """The threshold is the k-th largest magnitude and the mask keeps what a sort keeps, at
  sizes where float32 can hold neither N nor k (at s = 0.1 tfmot's float32 count is off by
  one weight at 2**24 - 3 and by two at 2**25 + 1; 0.9 is what users ask for)."""
  size = int(np.prod(shape))
  w = np.random.default_rng(size).standard_normal(shape).astype(F32)
  a = np.abs(w).ravel()
  # The fixed plan (15 candidates a pass) is slow on 2 CPU cores: once, at 2**24 - 3.
  runs = {
    (2**24 - 3,): [('adaptive', 0.1), ('fixed', 0.1)],
    (2**25 + 1,): [('adaptive', 0.1), ('adaptive', 0.9)],
  }.get(shape, [('adaptive', 0.1)])
  for plan, sparsity in runs:
    kept = _keep_count_reference(size, sparsity)
    expected = np.partition(a, size - kept)[size - kept]
    threshold, mask = _update(w, sparsity, 'exact', 256, plan)
    assert float(threshold) == float(expected), (plan, sparsity)
    assert int(jnp.sum(mask)) == int(np.sum(a >= expected)), (plan, sparsity)
