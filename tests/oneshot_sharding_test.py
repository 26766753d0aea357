"""jaxprune.oneshot on params sharded over 8 simulated CPU devices equals one device.

The multi-device part runs this file as a script in a subprocess (the device
count is fixed when jax starts), which prints one JSON line.
"""

import json
import subprocess
import sys

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxprune import oneshot

CASES = {
  'wanda 50%': dict(method='wanda', sparsity=0.5),
  'sparsegpt 50%': dict(method='sparsegpt', sparsity=0.5, blocksize=16),
  'sparsegpt 2:4': dict(method='sparsegpt', nm='2:4'),
}


def _model(params, x):
  return jax.nn.relu(x @ params['w1']) @ params['w2']


def multidevice() -> dict:
  """Prunes a two-layer model sharded over a 2 x 4 mesh and on device 0; the differences."""
  assert jax.device_count() == 8, jax.devices()
  rng = np.random.default_rng(0)
  params = {'w1': rng.normal(size=(32, 64)), 'w2': rng.normal(size=(64, 32))}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  batches = [jnp.asarray(rng.normal(size=(16, 32)), jnp.float32) for _ in range(2)]
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  specs = {'w1': P(None, 'model'), 'w2': P('model', None)}
  sharded = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
  data = [jax.device_put(b, NamedSharding(mesh, P('data', None))) for b in batches]
  one = jax.devices()[0]
  results = {}
  for name, kwargs in CASES.items():
    new, masks = oneshot.prune(_model, sharded, data, **kwargs)
    ref, ref_masks = oneshot.prune(
      _model, jax.device_put(params, one), jax.device_put(batches, one), **kwargs
    )
    results[name] = {
      'max_difference': max(
        float(np.max(np.abs(np.asarray(new[k]) - np.asarray(ref[k])))) for k in params
      ),
      'masks_equal': all(np.array_equal(masks[k], ref_masks[k]) for k in params),
      'sharding_kept': all(
        new[k].sharding.is_equivalent_to(sharded[k].sharding, 2) for k in params
      ),
      'sparsity': float(np.mean(np.asarray(masks['w1']) == 0)),
    }
  return results


@pytest.mark.slow
def test_sharded_params_prune_like_one_device():
  env = cpu_devices.env(8)
  done = subprocess.run(
    [sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600
  )
  assert done.returncode == 0, done.stderr[-4000:]
  results = json.loads(done.stdout.strip().splitlines()[-1])
  assert set(results) == set(CASES)
  for name, result in results.items():
    assert result['masks_equal'], name
    assert result['max_difference'] < 1e-4, (name, result)
    assert result['sharding_kept'], name
    assert result['sparsity'] == 0.5, name


if __name__ == '__main__':
  print(json.dumps(multidevice()))
