"""Property tests of the exact (k-th magnitude) threshold and of special inputs.

See docs/explanation/semantics.md#exact-thresholds and #weights-that-cannot-be-thresholded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import references
import strategies as cs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import jaxprune

F32 = np.float32
SETTINGS = settings(max_examples=30)
SHAPES = [(1,), (17,), (6, 10)]


@pytest.mark.slow
@pytest.mark.parametrize('shape', SHAPES)
@SETTINGS
@given(data=st.data())
def test_equals_sort(shape, data):
  weights = data.draw(cs.weights(shape))
  assume(np.abs(weights).max() > 0)
  sparsity = data.draw(cs.sparsities(weights.size))
  threshold, mask = cs.run_update_mask(weights, sparsity, method='exact')
  magnitudes = np.abs(weights)
  kept = references.keep_count(weights.size, sparsity)
  expected_threshold = np.sort(magnitudes.ravel())[::-1][kept - 1]
  np.testing.assert_array_equal(mask, magnitudes >= expected_threshold)
  assert threshold == expected_threshold


@pytest.mark.parametrize('shape', SHAPES)
@SETTINGS
@given(data=st.data())
def test_sparsity_on_tie_free_data(shape, data):
  weights = data.draw(cs.weights(shape, families=cs.TIE_FREE))
  sparsity = data.draw(cs.sparsities(weights.size))
  total = weights.size
  # Keep round() away from a half, where exact and float32 products may round apart.
  product = total * (1.0 - float(sparsity))
  assume(abs(product - np.floor(product) - 0.5) > 1e-3)
  _, mask = cs.run_update_mask(weights, sparsity, method='exact')
  kept = max(int(round(product)), 1)
  assert 1.0 - mask.sum() / total == 1.0 - kept / total


@settings(max_examples=30)
@given(data=st.data())
def test_decay_blends_thresholds(data):
  weights = data.draw(cs.weights((6, 10), families=cs.TIE_FREE))
  sparsity = data.draw(cs.sparsities(weights.size))
  old = F32(data.draw(st.floats(0.0, 10.0, width=32)))
  threshold, mask = cs.run_update_mask(weights, sparsity, method='exact', decay=0.5, threshold=old)
  current, _ = references.threshold_and_mask(np.abs(weights), sparsity, 256, 'exact')
  expected = current * F32(0.5) + old * F32(0.5)
  np.testing.assert_allclose(threshold, expected, rtol=1e-6, atol=1e-30)
  np.testing.assert_array_equal(mask, np.abs(weights) >= threshold)


@pytest.mark.parametrize('method', ['histogram', 'exact'])
@pytest.mark.parametrize('bad', [0.0, np.nan, np.inf, -np.inf])
def test_special_inputs_keep_previous_mask_and_threshold(method, bad):
  # All-zero weights (bad=0) and any NaN/Inf keep the stored threshold and mask.
  weights = np.linspace(1, 60, 60).astype(F32).reshape(6, 10)
  if bad == 0.0:
    weights = np.zeros_like(weights)
  else:
    weights[2, 3] = bad
  previous = np.arange(60).reshape(6, 10) % 3 == 0
  threshold, mask = cs.run_update_mask(
    weights, F32(0.5), method=method, threshold=1.25, previous_mask=previous
  )
  assert threshold == F32(1.25)
  np.testing.assert_array_equal(mask, previous)


def test_all_zero_without_previous_mask_keeps_everything():
  threshold, mask = jax.jit(jaxprune.update_mask)(np.zeros((6, 10), F32), F32(0.25), F32(0.5))
  assert threshold == F32(0.25) and mask.dtype == np.bool_ and np.asarray(mask).all()


def test_zero_kth_value_threshold_is_zero():
  weights = np.array([0, 0, 1, -1, 1, 1, -1, 0, 1, 0, -1, 1, 1, 1, -1, -1, 1], F32)
  threshold, mask = cs.run_update_mask(weights, F32(0.0), method='exact')
  assert mask.all()  # k = 17: the 17th largest magnitude is 0, and 0 >= 0.
  assert threshold == 0.0


@pytest.mark.parametrize('exponent', [-100, -60, 0, 60, 100])
def test_power_of_two_scales_match_reference(exponent):
  cs.power_of_two_case('exact', exponent)


@pytest.mark.parametrize('exponent', [-120, -110])
def test_tiny_magnitudes_match_reference(exponent):
  # Near the subnormals: counting a - t before scaling would flush the differences to 0 on CPU.
  cs.power_of_two_case('exact', exponent)
