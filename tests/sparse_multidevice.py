"""jaxprune.sparse on 8 simulated CPU devices: sharded training bit-identical to one device.

Run by tests/sparse_sharding_test.py in a subprocess (the device count is
fixed when jax is imported):

    python tests/sparse_multidevice.py

Prints one JSON object: for each rule and layout, whether params, masks and
the whole optimizer state equal the single-device run bit for bit, and
whether the masks are sharded like their params; and one mask update on a
mesh with explicit axes against one device.
"""

from __future__ import annotations

import os

os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
)

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sharding_multidevice import (  # noqa: E402
  LAYOUTS,
  make_mesh,
  mlp_params,
  params_shardings,
  trees_equal,
)

import jaxprune  # noqa: E402
from jaxprune import sparse  # noqa: E402

STEPS = 6


def rules() -> dict:
  adam = optax.adam(1e-2)
  dynamic = dict(end_step=5, update_freq=2, drop_fraction=0.5, distribution='erk')
  return {
    'static': sparse.static(adam, 0.8, distribution='erk'),
    'set': sparse.set_(adam, 0.8, **dynamic),
    'rigl': sparse.rigl(adam, 0.8, **dynamic),
    'ste': sparse.ste(adam, 0.8),
    'ste_nm': sparse.ste(adam, nm='2:4'),
  }


def run() -> dict:
  """Every rule's `STEPS` updates in one jitted scan, from fixed gradients.

  The gradients are inputs (not computed from a sharded batch, whose reduction
  order differs between layouts), so any difference comes from the transforms.
  """
  rng = np.random.default_rng(2)
  params = mlp_params(rng)
  grads = jax.tree.map(lambda p: rng.normal(size=(STEPS, *p.shape)).astype(np.float32), params)
  txs = rules()

  def train(all_params, states, grads):
    def one_step(carry, g):
      all_params, states = list(carry[0]), list(carry[1])
      for i, tx in enumerate(txs.values()):
        updates, states[i] = tx.update(g, states[i], all_params[i])
        all_params[i] = optax.apply_updates(all_params[i], updates)
      return (all_params, states), None

    return jax.lax.scan(one_step, (all_params, states), grads)[0]

  inits = [tx.init(params) for tx in txs.values()]
  ref = jax.jit(train)([params] * len(txs), inits, grads)
  results = {name: {} for name in txs}
  for layout in LAYOUTS[1:]:  # data parallel replicates everything: nothing to compare
    mesh = make_mesh(layout)
    p_shard = params_shardings(layout, mesh, params)
    o_shard = [
      jaxprune.state_shardings(jax.eval_shape(tx.init, params), p_shard) for tx in txs.values()
    ]
    ps_shard = [p_shard] * len(txs)
    g_shard = jax.tree.map(lambda s, mesh=mesh: NamedSharding(mesh, P(None, *s.spec)), p_shard)
    step = jax.jit(
      train, in_shardings=(ps_shard, o_shard, g_shard), out_shardings=(ps_shard, o_shard)
    )
    args = jax.device_put(([params] * len(txs), inits, grads), (ps_shard, o_shard, g_shard))
    out = step(*args)
    by_name = dict(jaxprune.named_leaves(p_shard))
    for i, name in enumerate(txs):
      masks = dict(jaxprune.named_leaves(sparse.get_masks(out[1][i])))
      before = dict(jaxprune.named_leaves(sparse.get_masks(inits[i])))
      results[name][layout] = {
        'params_equal': trees_equal(out[0][i], ref[0][i]),
        'state_equal': trees_equal(out[1][i], ref[1][i]),
        'masks_like_params': all(
          m.sharding.is_equivalent_to(by_name[n], m.ndim) for n, m in masks.items()
        ),
        'masks_changed': any(
          bool((np.asarray(m) != np.asarray(before[n])).any()) for n, m in masks.items()
        ),
      }
  return results


def run_explicit() -> dict:
  """One mask update of each rule on a mesh with explicit axes (`jax.make_mesh`'s default)."""
  rng = np.random.default_rng(3)
  params = mlp_params(rng)
  grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
  mesh = make_mesh('model_parallel', AxisType.Explicit)
  p_shard = params_shardings('fsdp', mesh, params)
  results = {}
  for name, tx in rules().items():
    # Step 2: a mask update of SET and RigL (update_freq=2).
    state = tx.init(params)._replace(step=jnp.int32(2))
    ref = jax.jit(tx.update)(grads, state, params)
    s_shard = jaxprune.state_shardings(state, p_shard)
    args = jax.device_put((grads, state, params), (p_shard, s_shard, p_shard))
    try:
      out = jax.jit(tx.update, out_shardings=(p_shard, s_shard))(*args)
    except Exception as err:  # noqa: BLE001 - reported to the calling test
      results[name] = {'error': f'{type(err).__name__}: {str(err).splitlines()[0]}'}
      continue
    results[name] = {
      'equal': trees_equal(out, ref),
      'masks_changed': any(
        bool((np.asarray(m) != np.asarray(o)).any())
        for m, o in zip(jax.tree.leaves(out[1].masks), jax.tree.leaves(state.masks), strict=True)
      ),
    }
  return results


if __name__ == '__main__':
  assert jax.device_count() == 8, jax.devices()
  print(json.dumps({'auto': run(), 'explicit': run_explicit()}))
