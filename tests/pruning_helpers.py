"""Helpers the core's test files share: hparams with overrides, a jit that compiles as users
do, steps of a transform, and the jaxprune warnings a call emits."""

import os
import warnings

import jax
import jax.numpy as jnp
import ml_collections

import jaxprune

# The masks reach their target at the first update (step 1).
ONE_SHOT = dict(pruning_frequency=1, sparsity_function_end_step=1)


def hparams(**overrides) -> ml_collections.ConfigDict:
  """`get_pruning_hparams()` with `overrides`."""
  hp = jaxprune.get_pruning_hparams()
  hp.update(overrides)
  return hp


def jit_as_users_compile(fn):
  """`jax.jit(fn)`, compiled with XLA's CPU fusion emitters where the test run turned them
  off (conftest.py): for a test that two programs round alike bit for bit, which the older
  emitters need not do where the two fuse the same operation differently."""
  older = 'xla_cpu_use_fusion_emitters=false' in os.environ.get('XLA_FLAGS', '')
  return jax.jit(fn, compiler_options={'xla_cpu_use_fusion_emitters': True} if older else None)


def run_updates(tx, params, steps):
  """The transform's state after `steps` jitted updates with zero gradients."""
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(steps):
    _, state = update(zeros, state, params)
  return state


def warnings_of(make) -> list[str]:
  """The jaxprune warnings that `make()` emits, each time (no de-duplication)."""
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    make()
  return [str(w.message) for w in record if 'jaxprune' in str(w.message)]
