"""Pruning placed before the optimizer is detected, and named in a warning.

`optax.chain(jaxprune.pruning(hp), optax.adam(lr))` lets Adam move the weights the
masks prune: the masks say 50% while the params hold almost no zeros. Each step
leaves the pruned entries at exactly zero when pruning comes last, so a mask
update that finds one nonzero counts in `PruningState.moved_updates`, and the
accessors warn with the fix.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import optax
import pytest
from tiny_models import mlp_params

import jaxprune

FIX = r'Put pruning last: optax\.chain\(optax\.adam\(lr\), jaxprune\.pruning\(hp\)\)'


def _hparams():
  # Updates at steps 0, 10, 20: 0% at step 0, then 25% at 10 and 50% at 20.
  return jaxprune.parse_hparams(
    'begin_pruning_step=0,end_pruning_step=20,pruning_frequency=10,target_sparsity=0.5,'
    'sparsity_function_end_step=20,weight_name_regex=kernel,threshold_method=exact'
  )


def _train(tx, steps=21):
  params = mlp_params()
  x = jax.random.normal(jax.random.key(1), (16, 4))

  def loss(params):
    hidden = jax.nn.relu(x @ params['Dense_0']['kernel'] + params['Dense_0']['bias'])
    return jnp.mean((hidden @ params['Dense_1']['kernel'] + params['Dense_1']['bias']) ** 2)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  for _ in range(steps):
    params, state = step(params, state)
  return params, state


def _zeros(params):
  return float(jnp.mean(params['Dense_0']['kernel'] == 0))


@pytest.mark.parametrize(
  'optimizer', [optax.adam(1e-2), optax.sgd(1e-2, momentum=0.9)], ids=['adam', 'sgd_momentum']
)
def test_pruning_before_the_optimizer_is_counted_and_warned(optimizer):
  params, state = _train(optax.chain(jaxprune.pruning(_hparams()), optimizer))
  pruning_state = jaxprune.find_pruning_state(state)
  # The update at step 20 finds the weights pruned at step 10 moved by the optimizer.
  assert int(pruning_state.moved_updates) == 1
  assert _zeros(params) < 0.1  # what the user gets: no sparsity
  with pytest.warns(UserWarning, match=FIX):
    sparsity = jaxprune.get_weight_sparsity(state)
  assert float(sparsity['Dense_0/kernel']) == 0.5  # what the masks claim
  for accessor in (jaxprune.get_masks, jaxprune.get_thresholds, jaxprune.summaries):
    with pytest.warns(UserWarning, match='1 mask update'):
      accessor(state)
  with pytest.warns(UserWarning, match=FIX):
    assert int(jaxprune.summaries(pruning_state)['model_pruning/moved_updates']) == 1


@pytest.mark.parametrize('form', ['chain', 'pruned', 'multisteps'])
def test_pruning_last_counts_nothing_and_stays_quiet(form):
  hparams = _hparams()
  tx = {
    'chain': lambda: optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams)),
    'pruned': lambda: jaxprune.pruned(optax.adam(1e-2), hparams),
    'multisteps': lambda: optax.MultiSteps(
      optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams)), 2
    ),
  }[form]()
  params, state = _train(tx, steps=42 if form == 'multisteps' else 21)
  pruning_state = jaxprune.find_pruning_state(state)
  assert int(pruning_state.last_update_step) == 20
  assert int(pruning_state.moved_updates) == 0
  assert _zeros(params) == 0.5
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    jaxprune.summaries(state)
    jaxprune.get_weight_sparsity(state)


def test_params_changed_outside_the_step_are_counted():
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(_hparams()))
  params, state = _train(tx, steps=20)  # pruned at step 10; step 20 is the next update
  assert int(jaxprune.find_pruning_state(state).moved_updates) == 0
  dense_again = jax.tree.map(jnp.ones_like, params)  # e.g. dense weights loaded again
  grads = jax.tree.map(jnp.zeros_like, params)
  _, state = jax.jit(tx.update)(grads, state, dense_again)
  assert int(jaxprune.find_pruning_state(state).moved_updates) == 1


class _HalfMasked:
  """A mask rule whose init already prunes the first row of every kernel."""

  def check(self, hparams):
    del hparams

  def init(self, params):
    def mask(path, leaf):
      if not jaxprune.leaf_name(path).endswith('kernel'):
        return None
      return jnp.ones(leaf.shape, bool).at[0].set(False)

    masks = jax.tree_util.tree_map_with_path(mask, params)
    return masks, {'unused': jnp.zeros((), jnp.float32)}

  def new_masks(self, hparams, weights, old_masks, thresholds, sparsity):
    del hparams, weights, sparsity
    return old_masks, thresholds, jnp.int32(0)


def test_an_update_at_step_0_does_not_count_weights_never_masked():
  # The user's params are nonzero where init's masks prune: nothing moved them yet.
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(_hparams(), mask_rule=_HalfMasked()))
  params, state = _train(tx, steps=1)
  assert int(jaxprune.find_pruning_state(state).last_update_step) == 0
  assert int(jaxprune.find_pruning_state(state).moved_updates) == 0
  assert float(jnp.sum(params['Dense_0']['kernel'][0] != 0)) == 0  # masked by that step
  params, state = _train_from(tx, params, state, steps=10)  # the update at step 10
  assert int(jaxprune.find_pruning_state(state).last_update_step) == 10
  assert int(jaxprune.find_pruning_state(state).moved_updates) == 0


def _train_from(tx, params, state, steps):
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(steps):
    updates, state = update(zeros, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def test_the_warning_is_quiet_under_jit():
  _, state = _train(optax.chain(jaxprune.pruning(_hparams()), optax.adam(1e-2)))
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    out = jax.jit(jaxprune.summaries)(state)
  assert int(out['model_pruning/moved_updates']) == 1


def _adam():
  return optax.adam(1e-2)


def _only(hp, layer):
  return jaxprune.parse_hparams(base=hp, weight_name_regex=f'{layer}/kernel')


def _pruning_of(hp, layer):
  return jaxprune.pruning(_only(hp, layer))


CHAINS = {
  'pruning before adam': (lambda hp: optax.chain(jaxprune.pruning(hp), _adam()), True),
  'named_chain, pruning first': (
    lambda hp: optax.named_chain(('prune', jaxprune.pruning(hp)), ('adam', _adam())),
    True,
  ),
  'pruned, then a scale': (
    lambda hp: optax.chain(jaxprune.pruned(_adam(), hp), optax.scale(0.5)),
    True,
  ),
  'a chain ending in pruning, then a scale': (
    lambda hp: optax.chain(optax.chain(_adam(), jaxprune.pruning(hp)), optax.scale(1.0)),
    True,
  ),
  'MultiSteps of pruning before adam': (
    lambda hp: optax.MultiSteps(optax.chain(jaxprune.pruning(hp), _adam()), 2),
    True,
  ),
  'pruning last': (lambda hp: optax.chain(_adam(), jaxprune.pruning(hp)), False),
  'two prunings of other leaves': (
    lambda hp: optax.chain(_adam(), _pruning_of(hp, 'Dense_0'), _pruning_of(hp, 'Dense_1')),
    False,
  ),
  'pruning, then identity': (
    lambda hp: optax.chain(_adam(), jaxprune.pruning(hp), optax.identity()),
    False,
  ),
  'named_chain, pruning, then identity': (
    lambda hp: optax.named_chain(
      ('adam', _adam()), ('prune', jaxprune.pruning(hp)), ('same', optax.identity())
    ),
    False,
  ),
  'pruned, then a pruning of other leaves': (
    lambda hp: optax.chain(
      jaxprune.pruned(_adam(), _only(hp, 'Dense_0')), _pruning_of(hp, 'Dense_1')
    ),
    False,
  ),
  'two prunings of the same leaves': (
    lambda hp: optax.chain(_adam(), jaxprune.pruning(hp), jaxprune.pruning(hp)),
    True,
  ),
  'pruning, identity, then a scale': (
    lambda hp: optax.chain(
      optax.chain(_adam(), jaxprune.pruning(hp), optax.identity()), optax.scale(2.0)
    ),
    True,
  ),
  'named_chain, pruning last': (
    lambda hp: optax.named_chain(('adam', _adam()), ('prune', jaxprune.pruning(hp))),
    False,
  ),
  'pruned': (lambda hp: jaxprune.pruned(_adam(), hp), False),
  'a clip, then pruned': (
    lambda hp: optax.chain(optax.clip(1.0), jaxprune.pruned(_adam(), hp)),
    False,
  ),
  'MultiSteps of pruning last': (
    lambda hp: optax.MultiSteps(optax.chain(_adam(), jaxprune.pruning(hp)), 2),
    False,
  ),
  'inject_hyperparams': (
    lambda hp: optax.inject_hyperparams(
      lambda learning_rate: optax.chain(optax.adam(learning_rate), jaxprune.pruning(hp))
    )(learning_rate=1e-2),
    False,
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CHAINS))
def test_a_transform_after_pruning_in_a_chain_is_told_when_the_step_is_traced(case):
  """Before the first step runs, at no cost in the compiled step: the chain's loop is
  read from the Python stack while the step is traced."""
  make, followed = CHAINS[case]
  tx = make(_hparams())
  params = mlp_params()
  state = tx.init(params)
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    jax.jit(tx.update).lower(params, state, params)
  told = [w for w in record if 'is followed by another transform' in str(w.message)]
  assert bool(told) == followed, [str(w.message) for w in record]
  for w in told:
    assert re.search(FIX, str(w.message)) and w.filename == __file__


@pytest.mark.parametrize(
  'make',
  [
    lambda hp: optax.chain(_adam(), _pruning_of(hp, 'Dense_0'), _pruning_of(hp, 'Dense_1')),
    lambda hp: optax.chain(_adam(), jaxprune.pruning(hp), optax.identity()),
  ],
  ids=['two prunings of other leaves', 'pruning, then identity'],
)
def test_a_later_transform_that_leaves_pruned_updates_alone_is_quiet(make):
  """Both kernels land exactly on 50% (16 of 4x8, 12 of 8x3 zeros), and nothing warns."""
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    params, state = _train(make(_hparams()))
    for pruning_state in (s for s in state if isinstance(s, jaxprune.PruningState)):
      jaxprune.summaries(pruning_state)  # moved_updates 0: the accessors are quiet too
  assert int(jnp.sum(params['Dense_0']['kernel'] == 0)) == 16
  assert int(jnp.sum(params['Dense_1']['kernel'] == 0)) == 12
  assert [str(w.message) for w in record if 'jaxprune' in str(w.message)] == []
