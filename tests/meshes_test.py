"""Running code that has no sharding rule for explicit mesh axes (`jaxprune._meshes`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxprune import _meshes as meshes
from jaxprune._masks import ranking as ranking


def _top_3(a):
  return jnp.zeros(a.size, bool).at[ranking.highest_k_indices(a, 3)].set(True).reshape(a.shape)


def test_on_any_mesh_runs_top_k_over_explicit_axes():
  mesh = jax.make_mesh((1,), ('x',), axis_types=(AxisType.Explicit,))
  x = jax.device_put(jnp.arange(8.0).reshape(2, 4), NamedSharding(mesh, P('x')))
  assert meshes.explicit_mesh([jnp.ones(3), x]) is not None
  want = [[False, False, False, False], [False, True, True, True]]
  with jax.set_mesh(mesh):
    with pytest.raises(Exception, match='unsharded over the axis'):  # why the helper exists
      jax.jit(_top_3)(x)
    out = jax.jit(lambda a: meshes.on_any_mesh(_top_3, meshes.sharded_like(a), a))(x)
  np.testing.assert_array_equal(out, want)
  assert jax.typeof(out).sharding.spec == P('x', None)
  # Without explicit axes it is the plain call.
  assert meshes.explicit_mesh([jnp.ones(3)]) is None
  np.testing.assert_array_equal(
    meshes.on_any_mesh(_top_3, None, jnp.arange(8.0).reshape(2, 4)), want
  )
