"""jaxprune._masks.blocks: block shapes, pooling and expansion, against numpy loops."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune
from jaxprune._config import specs
from jaxprune._masks import blocks as blocks


@pytest.mark.parametrize(
  'shape, dims, expected',
  [
    ((8, 6), (1, 1), None),  # elementwise
    ((8, 6), (2, 3), (2, 3)),
    ((8, 6), (-1, 2), (8, 2)),  # -1: the whole dimension
    ((8, 6), (16, 4), (8, 4)),  # larger than the dimension: the dimension
    ((1, 8, 1, 6), (2, 3), (2, 3)),  # size-1 axes are squeezed
    ((3, 3, 4, 8), (2, 2), None),  # a conv kernel is not 2-D
    ((16,), (2, 2), None),
  ],
)
def test_resolve_block_dims(shape, dims, expected):
  assert specs.resolve_block_dims(shape, dims) == expected


def _numpy_pool(values, bh, bw, reduce):
  rows, cols = math.ceil(values.shape[0] / bh), math.ceil(values.shape[1] / bw)
  return np.array(
    [
      [reduce(values[i * bh : (i + 1) * bh, j * bw : (j + 1) * bw]) for j in range(cols)]
      for i in range(rows)
    ],
    np.float32,
  )


@pytest.mark.parametrize('shape, dims', [((6, 4), (2, 2)), ((7, 5), (3, 2)), ((5, 9), (5, 4))])
def test_pooling_partial_blocks(shape, dims):
  # Small integers: every sum is exact, so the averages are the correctly rounded quotients.
  values = np.random.default_rng(0).integers(0, 50, shape).astype(np.float32)
  np.testing.assert_array_equal(
    blocks.pool(jnp.asarray(values), dims, 'MAX'), _numpy_pool(values, *dims, np.max)
  )
  expected = _numpy_pool(values, *dims, lambda b: np.float32(np.sum(b, dtype=np.float64) / b.size))
  np.testing.assert_array_equal(blocks.pool(jnp.asarray(values), dims, 'AVG'), expected)


def test_expand_repeats_each_block_and_crops():
  pooled = jnp.asarray([[True, False], [False, True]])
  full = np.asarray(blocks.expand(pooled, (2, 3), (3, 5)))
  expected = np.zeros((3, 5), bool)
  expected[:2, :3] = True
  expected[2:, 3:] = True
  np.testing.assert_array_equal(full, expected)


@pytest.mark.slow
def test_block_larger_than_the_weights_is_the_whole_dimension():
  w = jnp.asarray(np.random.default_rng(0).standard_normal((10, 8)), jnp.float32)
  huge = jaxprune.update_mask(w, 0.0, 0.5, block_dims=(2_000_000_000, 1))
  whole = jaxprune.update_mask(w, 0.0, 0.5, block_dims=(-1, 1))
  np.testing.assert_array_equal(huge[1], whole[1])
  assert huge[0] == whole[0]
