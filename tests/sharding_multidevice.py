"""Multi-device checks of the pruning transform, run on 8 simulated CPU devices.

Run by tests/sharding_*_test.py in a subprocess (the main test process has one
CPU device, and the device count is fixed when jax is imported):

    python tests/sharding_multidevice.py update histogram|exact
    python tests/sharding_multidevice.py train histogram|exact
    python tests/sharding_multidevice.py explicit histogram|exact

Prints one JSON object with the results; the calling test asserts on it. The
single-device reference is the same jitted function with every input on
device 0.
"""

from __future__ import annotations

import os

os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
)

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxprune  # noqa: E402

LAYOUTS = ('data_parallel', 'model_parallel', 'fsdp')
# `%x = <result> op(`: the result is one shape or a tuple of shapes (XLA
# combines small all-reduces into one with a tuple result).
COLLECTIVE = re.compile(
  r'=\s+(\([^)]*\)|\S+)\s+(all-gather|all-reduce|all-to-all|collective-permute|'
  r'reduce-scatter)(?:-start)?\('
)
SHAPE = re.compile(r'(\w+)\[([\d,]*)\]')


def make_mesh(layout: str, axis_type: AxisType = AxisType.Auto) -> jax.sharding.Mesh:
  shape = (2, 4) if layout == 'model_parallel' else (8, 1)
  return jax.make_mesh(shape, ('data', 'model'), axis_types=(axis_type, axis_type))


def param_spec(layout: str, shape: tuple[int, ...]) -> P:
  """Data parallel: replicated. Model parallel: the output (last) axis over 'model'.

  FSDP: the first axis divisible by 8 over both mesh axes (8 devices).
  """
  if layout == 'data_parallel':
    return P()
  if layout == 'model_parallel':
    return P(*([None] * (len(shape) - 1)), 'model') if shape[-1] % 4 == 0 else P()
  for axis, size in enumerate(shape):
    if size % 8 == 0:
      return P(*([None] * axis), ('data', 'model'))
  return P()


def params_shardings(layout: str, mesh, params):
  return jax.tree.map(lambda p: NamedSharding(mesh, param_spec(layout, p.shape)), params)


def hparams(method: str, **overrides):
  hp = jaxprune.get_pruning_hparams()
  hp.threshold_method = method
  hp.pruning_frequency = 1
  hp.target_sparsity = 0.7
  hp.sparsity_function_end_step = 4
  # Blocks that tile every device's shard in all three layouts, and whole rows.
  hp.block_dims_map = ['blocks/kernel:4x4', 'rows/kernel:1x-1']
  for name, value in overrides.items():
    setattr(hp, name, value)
  return hp


def update_params(rng):
  """Small kernels (bit-equality needs no more), a conv kernel and an unpruned bias."""

  def normal(*shape):
    return rng.normal(size=shape).astype(np.float32)

  return {
    'dense': {'kernel': normal(64, 128), 'bias': normal(128)},
    'blocks': {'kernel': normal(64, 128)},
    'rows': {'kernel': normal(64, 32)},
    'conv': {'kernel': normal(3, 3, 16, 32)},
  }


def collectives(hlo_text: str) -> list[tuple[str, str, int]]:
  """(op, 'dtype[shape]', number of elements) of each collective operand in compiled HLO."""
  found = []
  for result, op in COLLECTIVE.findall(hlo_text):
    for dtype, dims in SHAPE.findall(result):
      size = int(np.prod([int(d) for d in dims.split(',') if d]))
      found.append((op, f'{dtype}[{dims}]', size))
  return found


def trees_equal(a, b) -> bool:
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  if ta != tb:
    return False
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def run_update(method: str) -> dict:
  """One transform update (a mask update) sharded vs on one device, and its HLO."""
  rng = np.random.default_rng(0)
  params = update_params(rng)
  updates = jax.tree.map(lambda p: (0.05 * rng.normal(size=p.shape)).astype(np.float32), params)
  results = {}
  tx = jaxprune.pruning(hparams(method))
  # Step 3 of the schedule: a mask update at a sparsity strictly inside (0, 0.7).
  state = tx.init(params)._replace(step=jnp.int32(3), last_update_step=jnp.int32(0))
  ref_updates, ref_state = jax.jit(tx.update)(updates, state, params)
  ref_pruned = optax.apply_updates(params, ref_updates)
  for layout in LAYOUTS:
    mesh = make_mesh(layout)
    p_shard = params_shardings(layout, mesh, params)
    s_shard = jaxprune.state_shardings(state, p_shard)
    step = jax.jit(
      tx.update, in_shardings=(p_shard, s_shard, p_shard), out_shardings=(p_shard, s_shard)
    )
    args = jax.device_put((updates, state, params), (p_shard, s_shard, p_shard))
    compiled = step.lower(*args).compile()
    new_updates, new_state = compiled(*args)
    pruned = optax.apply_updates(args[2], new_updates)
    found = collectives(compiled.as_text())
    results[layout] = {
      'masks_equal': trees_equal(new_state.masks, ref_state.masks),
      'thresholds_equal': trees_equal(new_state.thresholds, ref_state.thresholds),
      'unequal_thresholds': sorted(
        name
        for name, t in jaxprune.get_thresholds(new_state).items()
        if not np.array_equal(t, jaxprune.get_thresholds(ref_state)[name])
      ),
      'pruned_params_equal': trees_equal(pruned, ref_pruned),
      'state_equal': trees_equal(new_state, ref_state),
      'mask_specs_like_params': all(
        m.sharding.is_equivalent_to(s, m.ndim)
        for m, s in zip(
          jax.tree.leaves(new_state.masks),
          jax.tree.leaves(jaxprune.get_masks(s_shard)),
          strict=True,
        )
      ),
      'threshold_specs': sorted(
        {str(t.sharding.spec) for t in jax.tree.leaves(new_state.thresholds)}
      ),
      'collectives': sorted({f'{op} {shape}' for op, shape, _ in found}),
      'collective_counts': {
        op: sum(1 for o, _, _ in found if o == op) for op in sorted({o for o, _, _ in found})
      },
      'largest_collective': max([size for _, _, size in found], default=0),
      'sparsity': {k: float(v) for k, v in jaxprune.get_weight_sparsity(new_state).items()},
    }
  return results


def run_explicit(method: str) -> dict:
  """The same update on a mesh with explicit axes (the default of jax.make_mesh)."""
  rng = np.random.default_rng(1)
  params = update_params(rng)
  updates = jax.tree.map(lambda p: (0.05 * rng.normal(size=p.shape)).astype(np.float32), params)
  tx = jaxprune.pruning(hparams(method))
  state = tx.init(params)._replace(step=jnp.int32(3), last_update_step=jnp.int32(0))
  ref = jax.jit(tx.update)(updates, state, params)
  mesh = make_mesh('model_parallel', AxisType.Explicit)
  p_shard = params_shardings('fsdp', mesh, params)
  s_shard = jaxprune.state_shardings(state, p_shard)
  args = jax.device_put((updates, state, params), (p_shard, s_shard, p_shard))
  try:
    out = jax.jit(tx.update, out_shardings=(p_shard, s_shard))(*args)
  except Exception as err:  # noqa: BLE001 - reported to the calling test
    return {'error': f'{type(err).__name__}: {str(err).splitlines()[0]}'}
  return {
    'equal': trees_equal(out, ref),
    'mask_specs': [str(m.sharding.spec) for m in jax.tree.leaves(out[1].masks)],
  }


def mlp_params(rng):
  def dense(n_in, n_out):
    scale = np.sqrt(2.0 / n_in)
    return {
      'kernel': (scale * rng.normal(size=(n_in, n_out))).astype(np.float32),
      'bias': np.zeros(n_out, np.float32),
    }

  return {'Dense_0': dense(64, 128), 'Dense_1': dense(128, 64), 'Dense_2': dense(64, 16)}


def mlp_loss(params, x, y):
  h = x
  for name in ('Dense_0', 'Dense_1'):
    h = jax.nn.relu(h @ params[name]['kernel'] + params[name]['bias'])
  logits = h @ params['Dense_2']['kernel'] + params['Dense_2']['bias']
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def run_train(method: str, steps: int = 16) -> dict:
  """A short adam + pruning run, sharded vs one device, compared at the end."""
  rng = np.random.default_rng(2)
  params = mlp_params(rng)
  teacher = rng.normal(size=(64, 16)).astype(np.float32)
  xs = rng.normal(size=(steps, 64, 64)).astype(np.float32)
  ys = np.argmax(xs @ teacher, axis=-1).astype(np.int32)
  results = {}
  hp = hparams(
    method,
    pruning_frequency=4,
    begin_pruning_step=4,
    sparsity_function_begin_step=4,
    sparsity_function_end_step=12,
    block_dims_map=['Dense_1/kernel:4x4'],
  )
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(hp))

  def train_step(params, opt_state, x, y, tx=tx):
    grads = jax.grad(mlp_loss)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  ref_step = jax.jit(train_step)
  ref = (params, tx.init(params))
  for i in range(steps):
    ref = ref_step(*ref, xs[i], ys[i])
  for layout in LAYOUTS:
    mesh = make_mesh(layout)
    p_shard = params_shardings(layout, mesh, params)
    o_shard = jaxprune.state_shardings(jax.eval_shape(tx.init, params), p_shard)
    batch = NamedSharding(mesh, P(('data', 'model') if layout != 'model_parallel' else 'data'))
    step = jax.jit(
      train_step, in_shardings=(p_shard, o_shard, batch, batch), out_shardings=(p_shard, o_shard)
    )
    init = jax.jit(tx.init, in_shardings=(p_shard,), out_shardings=o_shard)
    out = (jax.device_put(params, p_shard), init(jax.device_put(params, p_shard)))
    for i in range(steps):
      out = step(*out, xs[i], ys[i])
    results[layout] = compare_runs(ref, out)
  return results


def compare_runs(ref, out) -> dict:
  """Mask mismatches (each must sit within rounding distance of its threshold), param error."""
  (ref_params, ref_opt), (params, opt) = ref, out
  ref_masks, masks = jaxprune.get_masks(ref_opt), jaxprune.get_masks(opt)
  thresholds = jaxprune.get_thresholds(ref_opt)
  mismatches, far_from_threshold, max_error, agreeing_masks = 0, 0, 0.0, 0
  flat = jax.tree_util.tree_flatten_with_path(ref_params)[0]
  for path, ref_leaf in flat:
    name = jaxprune.leaf_name(path)
    leaf = np.asarray(_at(params, path))
    ref_leaf = np.asarray(ref_leaf)
    ref_mask, mask = _at(ref_masks, path), _at(masks, path)
    agree = np.ones(ref_leaf.shape, bool)
    if ref_mask is not None:
      ref_mask, mask = np.asarray(ref_mask), np.asarray(mask)
      agree = ref_mask == mask
      agreeing_masks += int(np.array_equal(ref_mask, mask))
      differ = ~agree
      mismatches += int(differ.sum())
      # The kept copy of a weight pruned in only one run is where it crossed the threshold.
      kept = np.where(ref_mask, ref_leaf, leaf)[differ]
      far_from_threshold += int(
        np.sum(np.abs(np.abs(kept) - float(thresholds[name])) > 1e-4 * float(thresholds[name]))
      )
    scale = max(float(np.max(np.abs(ref_leaf))), 1e-6)
    max_error = max(max_error, float(np.max(np.abs(leaf - ref_leaf)[agree], initial=0)) / scale)
  return {
    'mask_mismatches': mismatches,
    'mismatches_far_from_threshold': far_from_threshold,
    'masks_identical': agreeing_masks,
    'max_relative_param_error': max_error,
    'thresholds': {k: float(v) for k, v in jaxprune.get_thresholds(opt).items()},
    'ref_thresholds': {k: float(v) for k, v in thresholds.items()},
    'sparsity': {k: float(v) for k, v in jaxprune.get_weight_sparsity(params).items()},
  }


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


if __name__ == '__main__':
  assert jax.device_count() == 8, jax.devices()
  mode, method = sys.argv[1:]
  runner = {'update': run_update, 'train': run_train, 'explicit': run_explicit}[mode]
  print(json.dumps(runner(method)))
