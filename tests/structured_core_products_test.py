"""The product primitives and the one reader of their `dimension_numbers`
(`_core/products.py`), against layouts worked out by hand."""

import jax
import jax.numpy as jnp
import pytest

from jaxprune.structured._core import products
from jaxprune.structured._primitives import table


def _only_eqn(fn, *args):
  [eqn] = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name in products.PRODUCTS]
  return eqn


def test_dot_axes_of_a_batched_matmul():
  # (b, i, j) x (b, k, j): j is contracted, b is batched.
  lhs, rhs = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 4))
  eqn = _only_eqn(lambda a, b: jax.lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,)))), lhs, rhs)
  axes = products.dot_axes(eqn)
  assert axes == products.DotAxes(contract=((2,), (2,)), batch=((0,), (0,)))
  assert axes.contract[1] == (2,) and axes.batch[0] == (0,)
  # The output: the batch axis, then the lhs's free axis i, then the rhs's free axis k.
  assert eqn.outvars[0].aval.shape == (2, 3, 5)


def test_dot_axes_of_a_dense_layer_have_no_batch_axes():
  eqn = _only_eqn(jnp.dot, jnp.ones((8, 6)), jnp.ones((6, 4)))
  assert products.dot_axes(eqn) == ((((1,), (0,)), ((), ())))


@pytest.mark.parametrize(
  'layout, axes',
  [
    # NHWC input, HWIO kernel (Flax's): features last, kernel's out features last.
    (('NHWC', 'HWIO', 'NHWC'), (0, 3, (1, 2), 3, 2, (0, 1), 0, 3, (1, 2))),
    # NCHW, OIHW (PyTorch's).
    (('NCHW', 'OIHW', 'NCHW'), (0, 1, (2, 3), 0, 1, (2, 3), 0, 1, (2, 3))),
    # Mixed: an NHWC input, an OHWI kernel, an NCHW output.
    (('NHWC', 'OHWI', 'NCHW'), (0, 3, (1, 2), 0, 3, (1, 2), 0, 1, (2, 3))),
  ],
)
def test_conv_axes_name_each_layout(layout, axes):
  lhs_spec, rhs_spec, _ = layout
  shapes = {'N': 2, 'C': 3, 'H': 6, 'W': 5}
  kernel = {'O': 4, 'I': 3, 'H': 3, 'W': 2}
  x = jnp.ones(tuple(shapes[c] for c in lhs_spec))
  w = jnp.ones(tuple(kernel[c] for c in rhs_spec))
  eqn = _only_eqn(
    lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), 'SAME', dimension_numbers=layout),
    x,
    w,
  )
  found = products.conv_axes(eqn)
  assert tuple(found) == axes
  assert found.rhs_out == rhs_spec.index('O') and found.rhs_in == rhs_spec.index('I')
  # lhs_layout puts the input in (batch, feature, spatial...) order.
  assert jnp.transpose(x, found.lhs_layout).shape == (2, 3, 6, 5)
  assert found.out_feature == layout[2].index('C')


def test_every_product_has_a_flops_rule():
  """The FLOPs counter counts the products (and only what has a rule)."""
  for name in products.PRODUCTS:
    assert table.lookup(name).flops is not None
