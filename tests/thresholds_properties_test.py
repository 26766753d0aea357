"""Property tests of the histogram threshold and mask against a numpy reference.

See docs/explanation/semantics.md#histogram-thresholds.
"""

from __future__ import annotations

import numpy as np
import pytest
import references
import strategies as cs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

F32 = np.float32
SETTINGS = settings(max_examples=30)

# (shape, nbins): each pair is one jit compile; the data and sparsity vary freely.
# The two large shapes hold >= 4096 elements in every 16th row, so the search
# starts from an estimate on that sample; the small ones bisect directly.
CONFIGS = [
  ((1,), 256),
  ((17,), 7),
  ((6, 10), 100),
  ((3, 5, 7), 256),
  ((64,), 2),
  ((1024, 64), 256),
  ((40, 2048), 10),
]


@pytest.mark.parametrize('shape,nbins', CONFIGS)
@SETTINGS
@given(data=st.data())
def test_equals_reference(shape, nbins, data):
  weights = data.draw(cs.weights(shape, nbins=nbins))
  assume(np.abs(weights).max() > 0)
  sparsity = data.draw(cs.sparsities(weights.size, nbins))
  threshold, mask = cs.run_update_mask(weights, sparsity, nbins=nbins)
  expected_threshold, expected_mask = references.threshold_and_mask(
    np.abs(weights), sparsity, nbins, 'histogram'
  )
  assert threshold == expected_threshold
  np.testing.assert_array_equal(mask, expected_mask)


@pytest.mark.parametrize('shape,nbins', CONFIGS)
@SETTINGS
@given(data=st.data())
def test_sparsity_within_one_bin(shape, nbins, data):
  # Continuous random data: no ties and no value on the threshold, so the
  # achieved sparsity is at most s and at least s minus the share of the
  # elements in the first bin whose CDF reaches s.
  weights = data.draw(cs.weights(shape, families=('normal',), nbins=nbins))
  sparsity = data.draw(cs.sparsities(weights.size, nbins))
  _, mask = cs.run_update_mask(weights, sparsity, nbins=nbins)
  _, first, bins = references.histogram_rule(np.abs(weights), sparsity, nbins)
  share = np.mean(bins == first)
  achieved = 1.0 - mask.mean()
  tolerance = 1e-6  # the CDF is compared in float32
  assert achieved <= sparsity + tolerance
  assert achieved >= sparsity - share - tolerance


@settings(max_examples=30)
@given(data=st.data())
def test_decay_blends_thresholds(data):
  # thr = cur * (1 - decay) + old * decay, and the mask is a > thr.
  weights = data.draw(cs.weights((6, 10), nbins=100))
  assume(np.abs(weights).max() > 0)
  sparsity = data.draw(cs.sparsities(weights.size, 100))
  old = F32(data.draw(st.floats(0.0, 10.0, width=32)))
  threshold, mask = cs.run_update_mask(weights, sparsity, nbins=100, decay=0.9, threshold=old)
  current, _ = references.threshold_and_mask(np.abs(weights), sparsity, 100, 'histogram')
  expected = current * F32(0.1) + old * F32(0.9)
  np.testing.assert_allclose(threshold, expected, rtol=1e-6, atol=1e-30)
  np.testing.assert_array_equal(mask, np.abs(weights) > threshold)


@pytest.mark.parametrize('nbins', [7, 100, 256])
def test_zero_sparsity_threshold_is_zero(nbins):
  # No bin has a CDF below 0, so the threshold is 0 / nbins * max = +0 and every nonzero is kept.
  shape = {7: (17,), 100: (6, 10), 256: (1,)}[nbins]  # shapes the tests above compiled
  weights = np.linspace(1, np.prod(shape), np.prod(shape)).astype(F32).reshape(shape)
  threshold, mask = cs.run_update_mask(weights, F32(0.0), nbins=nbins)
  assert mask.all()
  assert threshold == 0.0 and not np.signbit(threshold)


@pytest.mark.parametrize('exponent', [-100, -60, 0, 60, 100])
def test_power_of_two_scales_match_reference(exponent):
  cs.power_of_two_case('histogram', exponent)


@pytest.mark.parametrize('exponent', [-115, -110, 110, 115])
def test_extreme_magnitudes_match_reference(exponent):
  cs.power_of_two_case('histogram', exponent)
