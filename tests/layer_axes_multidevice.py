"""A stacked leaf with its layer axis second, pruned per layer on 4 simulated CPU devices.

Run by tests/layer_axes_test.py in a subprocess (the device count is fixed when jax is
imported): `python tests/layer_axes_multidevice.py`. Prints one JSON object: for each
mesh axis type and form, whether the params and masks after jitted steps keep the
params' shardings (no out_shardings given), whether the masks, thresholds and params
equal those of one device, the masks and thresholds, and the compiled step's collectives;
the same for the stacks transposed to the leading layout.
"""

from __future__ import annotations

import os

os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=4'
)

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from sharding_multidevice import collectives  # noqa: E402

import jaxprune  # noqa: E402

# MaxText's scanned layout (param_scan_axis=1): (embed, layers, mlp), sharded as FSDP
# along embed and tensor parallel along mlp; a second stack with its layer axis sharded.
SPECS = {
  'decoder': {
    'wi': {'kernel': P('data', None, 'model')},
    'wo': {'kernel': P(None, 'data', 'model')},
  }
}
HPARAMS = (
  'target_sparsity=0.5,sparsity_function_end_step=1,pruning_frequency=1,'
  'threshold_method=exact,layer_axes_map=[decoder/.*kernel:{layers}]'
)


def params(rng):
  return {
    'decoder': {
      'wi': {'kernel': rng.normal(size=(64, 4, 96)).astype(np.float32)},
      'wo': {'kernel': rng.normal(size=(96, 4, 64)).astype(np.float32)},
    }
  }


def _leading(spec: P) -> P:
  return P(spec[1], spec[0], spec[2])


def run(axis_type: AxisType, form: str, leading: bool = False) -> dict:
  """Two jitted steps (the target is 0 at step 0, 0.5 from step 1) on a 2x2 mesh and on
  one device. `leading`: the same stacks transposed to (layers, embed, mlp), with
  `layer_axes_map`'s leading form; results are moved back to the '@1' layout."""
  rng = np.random.default_rng(0)
  host = params(rng)
  grads = jax.tree.map(lambda p: (0.05 * rng.normal(size=p.shape)).astype(np.float32), host)
  specs = SPECS
  if leading:
    host, grads = jax.tree.map(lambda x: np.moveaxis(x, 1, 0), (host, grads))
    specs = jax.tree.map(_leading, SPECS, is_leaf=lambda x: isinstance(x, P))
  hp = HPARAMS.format(layers='1' if leading else '@1')
  opt = optax.sgd(0.1)
  tx = jaxprune.pruned(opt, hp) if form == 'pruned' else optax.chain(opt, jaxprune.pruning(hp))

  def step(p, g, s):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  one_params, one_state = host, tx.init(host)
  for _ in range(2):
    one_params, one_state = jax.jit(step)(one_params, grads, one_state)
  mesh = jax.make_mesh((2, 2), ('data', 'model'), axis_types=(axis_type, axis_type))
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
  state = tx.init(host)
  new_params, sharded_grads, new_state = jax.device_put(
    (host, grads, state), (shardings, shardings, jaxprune.state_shardings(state, shardings))
  )
  compiled = jax.jit(step).lower(new_params, sharded_grads, new_state).compile()
  for _ in range(2):  # no out_shardings: the partitioner chooses them
    new_params, new_state = jax.jit(step)(new_params, sharded_grads, new_state)
  masks = jaxprune.get_masks(new_state)

  def kept(tree):
    return all(
      x.sharding.is_equivalent_to(s, x.ndim)
      for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True)
    )

  def equal(a, b):
    return all(
      np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )

  def as_at1(tree):
    return [np.moveaxis(np.asarray(x), 0, 1) if leading else np.asarray(x) for x in tree]

  return {
    'params_sharding_kept': kept(new_params),
    'masks_sharding_kept': kept(masks),
    'params_equal': equal(new_params, one_params),
    'masks_equal': equal(masks, jaxprune.get_masks(one_state)),
    'thresholds_equal': equal(
      jaxprune.get_thresholds(new_state), jaxprune.get_thresholds(one_state)
    ),
    'thresholds': [np.asarray(t).tolist() for t in jaxprune.get_thresholds(new_state).values()],
    'masks': [m.tolist() for m in as_at1(jax.tree.leaves(masks))],
    'collectives': sorted(set(collectives(compiled.as_text()))),
  }


def main() -> None:
  results = {
    'auto/pruned': run(AxisType.Auto, 'pruned'),
    'auto/chain': run(AxisType.Auto, 'chain'),
    'explicit/pruned': run(AxisType.Explicit, 'pruned'),
    'leading/pruned': run(AxisType.Auto, 'pruned', leading=True),
  }
  print(json.dumps(results))


if __name__ == '__main__':
  main()
