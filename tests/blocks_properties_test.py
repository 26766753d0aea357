"""Property tests of block masks against a block-by-block numpy reference.

See docs/explanation/semantics.md#blocks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import references
import strategies as cs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

F32 = np.float32

# (shape, block_dims, pooling, method, nbins): partial last blocks, -1 dims,
# leading and middle size-1 dims, a single block covering everything.
CONFIGS = [
  ((7, 10), (2, 3), 'AVG', 'histogram', 256),
  ((7, 10), (-1, 4), 'MAX', 'exact', 256),
  ((1, 9, 8), (4, -1), 'AVG', 'exact', 256),
  ((12, 8), (3, 2), 'MAX', 'histogram', 10),
  ((6, 1, 5), (2, 2), 'AVG', 'histogram', 256),
  ((5, 6), (-1, -1), 'MAX', 'histogram', 256),
]


def _assert_constant_on_blocks(mask, block_dims):
  squeezed = mask.reshape([d for d in mask.shape if d != 1])
  bh, bw = (d if b == -1 else b for b, d in zip(block_dims, squeezed.shape, strict=True))
  for i in range(math.ceil(squeezed.shape[0] / bh)):
    for j in range(math.ceil(squeezed.shape[1] / bw)):
      block = squeezed[i * bh : (i + 1) * bh, j * bw : (j + 1) * bw]
      assert block.all() or not block.any(), (i, j, block)


@pytest.mark.slow
@pytest.mark.parametrize('shape,block_dims,pooling,method,nbins', CONFIGS)
@settings(max_examples=25)
@given(data=st.data())
def test_block_mask_equals_reference(shape, block_dims, pooling, method, nbins, data):
  # Dyadic data keep every block sum exact in float32, so AVG has one rounding.
  weights = data.draw(cs.weights(shape, families=cs.DYADIC, nbins=nbins))
  assume(np.abs(weights).max() > 0)
  sparsity = data.draw(cs.sparsities(weights.size, nbins))
  threshold, mask = cs.run_update_mask(
    weights, sparsity, nbins=nbins, method=method, block_dims=block_dims, pooling=pooling
  )
  expected_threshold, expected_mask = references.block_mask(
    weights, sparsity, block_dims, pooling, nbins, method
  )
  _assert_constant_on_blocks(mask, block_dims)
  np.testing.assert_array_equal(mask, expected_mask)
  assert threshold == expected_threshold


@pytest.mark.parametrize('shape', [(4, 3, 5), (7,)])
@settings(max_examples=15)
@given(data=st.data())
def test_not_two_dimensional_uses_elementwise_rule(shape, data):
  # squeeze(w) is not 2-D: the block dims are ignored (docs/explanation/semantics.md#blocks).
  weights = data.draw(cs.weights(shape))
  assume(np.abs(weights).max() > 0)
  sparsity = data.draw(cs.sparsities(weights.size))
  threshold, mask = cs.run_update_mask(weights, sparsity, block_dims=(2, 2))
  expected_threshold, expected_mask = references.threshold_and_mask(
    np.abs(weights), sparsity, 256, 'histogram'
  )
  assert threshold == expected_threshold
  np.testing.assert_array_equal(mask, expected_mask)


def test_avg_pooling_counts_only_elements_inside():
  # The example of docs/explanation/semantics.md#blocks: [[1,2,3],[4,5,6],[7,8,9]] with 2x2 blocks
  # pools to [[3, 4.5], [7.5, 9]].
  # With s = 0.5 of 4 blocks, exact keeps k = 2 blocks: 7.5 and 9 (the bottom row).
  weights = np.arange(1, 10, dtype=F32).reshape(3, 3)
  np.testing.assert_array_equal(references.pool(weights, 2, 2, 'AVG'), [[3, 4.5], [7.5, 9]])
  threshold, mask = cs.run_update_mask(weights, F32(0.5), method='exact', block_dims=(2, 2))
  assert threshold == F32(7.5)
  np.testing.assert_array_equal(mask, [[0, 0, 0], [0, 0, 0], [1, 1, 1]])
