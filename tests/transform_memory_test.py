"""The temporary memory of the donated training step, compiled as users compile it.

XLA's `memory_analysis()` of `tx.update` then `optax.apply_updates`, params and optimizer
state donated, beyond plain Adam's, as a multiple of the params' bytes: the mask update's
conditional reads the optimizer's updates, stored once (1x; recomputing the optimizer in
every counting pass stores nothing, but XLA:CPU compiles a division by a scalar there as
a multiplication by its reciprocal, so those weights would differ from the stored ones
in the last bit), and the new masks leave it packed eight to a byte (1/32 of float32
params). With `mask_source='params'` the search reads the params and only the bits are
left. Nothing else the size of the weights, on every plan and rule (block pooling
stores the block averages, a 16th of its leaf). Measured in a subprocess with XLA's
default optimizations (the suite turns most of them off to compile faster, and the
buffers depend on them).
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys, warnings
import jax, jax.numpy as jnp, optax, jaxprune
warnings.simplefilter('ignore')
f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
params = {'embed': {'embedding': f32(1024, 256)}, 'a': {'kernel': f32(256, 1024)},
          'b': {'kernel': f32(1024, 256), 'bias': f32(256)}}
nbytes = sum(4 * x.size for x in jax.tree.leaves(params))

def temp(tx):
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s
  state = jax.eval_shape(tx.init, params)
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
  return compiled.memory_analysis().temp_size_in_bytes

PARAMS_SOURCE_RULES = ('', 'threshold_method=exact', 'global_pruning=true')
opt = optax.adam(1e-3)
adam = temp(opt)
out = {}
for rule in sys.argv[1:]:
  for plan in ('fixed', 'adaptive'):
    hp = 'target_sparsity=0.9,pruning_frequency=10,sparsity_function_end_step=20,'
    hp += f'mask_search={plan}' + (',' + rule if rule else '')
    forms = [
      ('pruned', jaxprune.pruned(opt, hp)),
      ('chained', optax.chain(opt, jaxprune.pruning(hp))),
    ]
    if rule in PARAMS_SOURCE_RULES:
      forms.append(('pruned params', jaxprune.pruned(opt, hp + ',mask_source=params')))
    for form, tx in forms:
      out[f'{rule or "histogram"} {plan} {form}'] = (temp(tx) - adam) / nbytes
print(json.dumps(out))
"""

RULES = [
  '',
  'threshold_method=exact',
  'global_pruning=true',
  'block_dims_map=[a:4x4]',
  'nm_sparsity_map=[kernel:2:4]',
]


@pytest.fixture(scope='module')
def temps():
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.update(JAX_DISABLE_MOST_OPTIMIZATIONS='0', JAX_PLATFORMS='cpu')
  result = subprocess.run(
    [sys.executable, '-c', SCRIPT, *RULES], capture_output=True, text=True, env=env, timeout=600
  )
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize('rule', ['histogram', 'threshold_method=exact', 'global_pruning=true'])
@pytest.mark.parametrize('plan', ['fixed', 'adaptive'])
def test_pruned_stores_the_updates_once_and_the_masks_bits(temps, rule, plan):
  # The updates once and the new masks as bits: nothing of the search is stored.
  assert temps[f'{rule} {plan} pruned'] <= 1 + 1 / 32 + 0.01


@pytest.mark.slow
@pytest.mark.parametrize('rule', ['histogram', 'threshold_method=exact', 'global_pruning=true'])
@pytest.mark.parametrize('plan', ['fixed', 'adaptive'])
def test_chained_stores_the_updates_once_and_the_masks_bits(temps, rule, plan):
  # Adam's direction is not stored beside the updates it becomes.
  assert temps[f'{rule} {plan} chained'] <= 1 + 1 / 32 + 0.01


@pytest.mark.slow
@pytest.mark.parametrize('rule', ['histogram', 'threshold_method=exact', 'global_pruning=true'])
@pytest.mark.parametrize('plan', ['fixed', 'adaptive'])
def test_params_source_stores_only_the_masks_bits(temps, rule, plan):
  # mask_source='params' thresholds the params, which are in memory already: nothing of
  # the step is stored for the search, only the new masks' bits leave the conditional.
  assert temps[f'{rule} {plan} pruned params'] <= 1 / 32 + 0.01


@pytest.mark.slow
@pytest.mark.parametrize('form', ['pruned', 'chained'])
@pytest.mark.parametrize('plan', ['fixed', 'adaptive'])
def test_blocked_stores_the_pooled_magnitudes_not_the_weights(temps, form, plan):
  # The average's last halving is a reduce, so XLA stores only the block averages (a 16th
  # of 'a', itself a third of the params), not the magnitudes, and reads the weights 8 times.
  assert temps[f'block_dims_map=[a:4x4] {plan} {form}'] <= 1 + 1 / 32 + 2 / 3 / 16 + 0.02


@pytest.mark.slow
@pytest.mark.parametrize('form', ['pruned', 'chained'])
@pytest.mark.parametrize('plan', ['fixed', 'adaptive'])
def test_nm_masks_rank_without_sorting_or_storing_magnitudes(temps, form, plan):
  # Each entry meets its group through m - 1 rolls, so the magnitudes are computed where
  # they are compared and the kernels' magnitudes (two thirds of the params) never stored.
  assert temps[f'nm_sparsity_map=[kernel:2:4] {plan} {form}'] <= 1 + 1 / 32 + 0.02
