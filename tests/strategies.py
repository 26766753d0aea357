"""Hypothesis strategies and a jitted runner for the core property tests (tests only).

Shapes are fixed per test configuration (each new shape costs a jit compile of
the threshold search); the data and the sparsity vary, and are traced.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import references
from hypothesis import strategies as st

import jaxprune

F32 = np.float32

# Families whose values are distinct (no ties), so sparsity bounds are sharp.
TIE_FREE = ('normal', 'arange', 'linspace')
# Families whose block sums are exact in float32 (integers times a power of two).
DYADIC = ('arange', 'integers', 'dyadic_normal')
ALL = ('normal', 'arange', 'linspace', 'integers', 'bin_edges', 'dyadic_normal')


@st.composite
def weights(
  draw, shape: tuple[int, ...], families: tuple[str, ...] = ALL, nbins: int = 256
) -> np.ndarray:
  """float32 weights of `shape` from one of `families`.

  'arange', 'linspace', 'integers' and 'bin_edges' put many values exactly on
  histogram bin edges, which is where a wrongly rounded division shows.
  """
  size = int(np.prod(shape))
  family = draw(st.sampled_from(families))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  signs = rng.choice(np.array([-1.0, 1.0]), size)
  if family == 'normal':
    values = rng.standard_normal(size) * draw(st.sampled_from([1e-3, 0.1, 1.0, 3.7, 1e4]))
  elif family == 'arange':
    exponent = draw(st.integers(-20, 20))
    values = signs * (rng.permutation(size) + draw(st.integers(1, 3))) * 2.0**exponent
  elif family == 'linspace':
    # Positive ranges, signs drawn apart: a range across 0 repeats magnitudes (-1 and 1).
    low, high = draw(st.sampled_from([(1, 100), (0.5, 3), (0.01, 1), (0.001, 0.01)]))
    values = signs * rng.permutation(np.linspace(low, high, size))
  elif family == 'integers':
    bound = draw(st.sampled_from([1, 3, 10, 255]))
    values = rng.integers(-bound, bound + 1, size).astype(np.float64)
  elif family == 'bin_edges':
    # Values k * m / nbins computed the way the threshold is: fl(fl(k / nbins) * m).
    top = F32(draw(st.sampled_from([1.0, 3.0, 0.7, 100.0])))
    ks = rng.integers(0, nbins + 1, size)
    ks[0] = nbins
    values = signs * ((ks.astype(F32) / F32(nbins)) * top)
  else:  # dyadic_normal: normal values rounded to multiples of 2**-10.
    values = np.round(rng.standard_normal(size) * 1024) / 1024
  return np.asarray(values, F32).reshape(shape)


def sparsities(size: int, nbins: int = 256):
  """Sparsities in [0, 1): arbitrary, multiples of 1/N and multiples of 1/nbins."""
  return st.one_of(
    st.floats(0.0, 1.0, exclude_max=True, width=32, allow_subnormal=False),
    st.integers(0, size - 1).map(lambda j: float(F32(j) / F32(size))),
    st.integers(0, nbins - 1).map(lambda k: float(F32(k) / F32(nbins))),
  ).map(F32)


@functools.cache
def _jitted_update(
  nbins: int, method: str, block_dims: tuple[int, int], pooling: str, decay: float
):
  """One jitted update_mask per static configuration; new shapes add cache entries."""
  return jax.jit(
    functools.partial(
      jaxprune.update_mask,
      nbins=nbins,
      threshold_method=method,
      block_dims=block_dims,
      block_pooling_function=pooling,
      threshold_decay=decay,
    )
  )


def run_update_mask(
  weights: np.ndarray,
  sparsity: np.float32,
  *,
  nbins: int = 256,
  method: str = 'histogram',
  block_dims: tuple[int, int] = (1, 1),
  pooling: str = 'AVG',
  decay: float = 0.0,
  threshold: float = 0.0,
  previous_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Runs jaxprune.update_mask under jit; checks the output types every property relies on."""
  fn = _jitted_update(nbins, method, tuple(block_dims), pooling, decay)
  if previous_mask is None:  # always pass one: a second signature would cost a compile
    previous_mask = np.ones(weights.shape, bool)
  new_threshold, mask = fn(weights, F32(threshold), F32(sparsity), previous_mask=previous_mask)
  new_threshold, mask = np.asarray(new_threshold), np.asarray(mask)
  assert mask.dtype == np.bool_ and mask.shape == weights.shape
  assert new_threshold.shape == () and new_threshold.dtype == np.float32
  assert not np.isnan(new_threshold)
  return new_threshold, mask


def power_of_two_case(method: str, exponent: int) -> None:
  """Permuted 1..100 (1-D) times 2**exponent: every threshold and mask matches the reference."""
  weights = np.random.default_rng(0).permutation(np.arange(1, 101)).astype(F32)
  weights = weights * F32(2.0**exponent)
  for sparsity in (F32(0.1), F32(0.5), F32(0.95)):
    threshold, mask = run_update_mask(weights, sparsity, method=method)
    expected_threshold, expected_mask = references.threshold_and_mask(
      np.abs(weights), sparsity, 256, method
    )
    assert threshold == expected_threshold, (sparsity, threshold, expected_threshold)
    np.testing.assert_array_equal(mask, expected_mask)
