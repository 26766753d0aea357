"""Masks packed eight to a byte (`jaxprune._transform.bits`), against numpy's own bit packing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune._transform import bits as bits


@pytest.mark.parametrize('shape', [(), (1,), (7,), (8,), (9,), (3, 16), (2, 3, 17), (5, 1)])
def test_packed_is_numpys_little_endian_packbits(shape):
  mask = np.random.default_rng(sum(shape) + len(shape)).random(shape) < 0.5
  packed = bits.packed(jnp.asarray(mask))
  expected = np.packbits(np.atleast_1d(mask), axis=-1, bitorder='little')
  assert packed.dtype == jnp.uint8
  assert packed.shape == bits.packed_shape(shape) == expected.shape
  np.testing.assert_array_equal(np.asarray(packed), expected)


@pytest.mark.parametrize('shape', [(), (1,), (7,), (8,), (9,), (3, 16), (2, 3, 17)])
def test_unpacked_undoes_packed(shape):
  mask = np.random.default_rng(len(shape)).random(shape) < 0.3
  again = bits.unpacked(bits.packed(jnp.asarray(mask)), shape)
  assert again.dtype == jnp.bool_ and again.shape == shape
  np.testing.assert_array_equal(np.asarray(again), mask)


def test_the_first_entry_is_the_lowest_bit():
  mask = jnp.array([True] + [False] * 7 + [False, True])
  assert bits.packed(mask).tolist() == [1, 2]  # 0b00000001, then entry 9 -> bit 1


def test_packed_shape_rounds_the_last_axis_up_to_bytes():
  assert bits.packed_shape((4, 1)) == (4, 1)
  assert bits.packed_shape((4, 8)) == (4, 1)
  assert bits.packed_shape((4, 9)) == (4, 2)
  assert bits.packed_shape(()) == (1,)


def test_a_sharded_mask_keeps_its_sharding_through_packing():
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices), ('x',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('x', None))
  rows = 2 * len(devices)
  mask = jax.device_put(jnp.arange(rows * 24).reshape(rows, 24) % 3 == 0, sharding)
  again = jax.jit(lambda m: bits.unpacked(bits.packed(m), m.shape))(mask)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(mask))
