"""Tests for jaxprune_train._stats: per-leaf reports follow the transform's own leaf specs."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jaxprune
from jaxprune_train import _stats as stats
from jaxprune_train._step import create_train_state


def _params():
  keys = jax.random.split(jax.random.key(0), 3)
  return {
    'Dense_0': {'kernel': jax.random.normal(keys[0], (8, 6)), 'bias': jnp.ones(6)},
    'Dense_1': {'kernel': jax.random.normal(keys[1], (8, 4))},
    'Dense_2': {'kernel': jax.random.normal(keys[2], (4, 3))},
  }


def _state(hparams):
  tx = optax.chain(optax.sgd(0.1), jaxprune.pruning(hparams))
  return create_train_state(_params(), tx)


def test_resolved_blocks_nm_and_map_targets():
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.75,block_dims_map=[Dense_0/kernel:-1x2],'
    'nm_sparsity_map=[Dense_1/kernel:2:4],weight_sparsity_map=[Dense_2/kernel:0.5]'
  )
  reports = {r.name: r for r in stats.leaf_reports(_state(hparams), hparams)}
  assert list(reports) == ['Dense_0/kernel', 'Dense_1/kernel', 'Dense_2/kernel']
  # -1 is the whole first dimension of the (8, 6) kernel: blocks of 8x2.
  assert reports['Dense_0/kernel'].block == (8, 2) and reports['Dense_0/kernel'].pattern == '8x2'
  assert reports['Dense_0/kernel'].target == 0.75
  # Keeping 2 of every 4 is 50% sparsity; N:M has no threshold.
  assert reports['Dense_1/kernel'].nm == (2, 4) and reports['Dense_1/kernel'].pattern == '2:4'
  assert reports['Dense_1/kernel'].target == 0.5 and reports['Dense_1/kernel'].threshold is None
  assert reports['Dense_2/kernel'].target == 0.5 and reports['Dense_2/kernel'].pattern == '1x1'
  assert reports['Dense_2/kernel'].threshold == 0.0  # no mask update yet
  assert all(r.nonzero == r.size and r.achieved == 0 for r in reports.values())


def test_no_reports_without_pruning():
  assert stats.leaf_reports(_state(jaxprune.get_pruning_hparams()), None) == []


@pytest.mark.parametrize('method', ['histogram', 'exact'])
def test_global_pruning_targets_are_the_shared_one(method):
  hparams = jaxprune.parse_hparams(
    f'target_sparsity=0.6,global_pruning=true,threshold_method={method}'
  )
  reports = stats.leaf_reports(_state(hparams), hparams)
  assert [r.target for r in reports] == [0.6, 0.6, 0.6]
