"""Tests for jaxprune_train._data: digits split, batch order, the .npz loader."""

import ml_dtypes
import numpy as np
import pytest
from sklearn.datasets import load_digits as sk_load_digits

from jaxprune_train import _data as data


def _rows(x):
  return sorted(map(bytes, np.ascontiguousarray(x.reshape(len(x), -1))))


def test_digits_split_sizes_shapes_and_range():
  ds = data.load_digits(seed=0, test_fraction=0.25)
  # 1,797 images; round(0.25 * 1797) = 449 held out.
  assert ds.x_train.shape == (1348, 8, 8, 1)
  assert ds.x_test.shape == (449, 8, 8, 1)
  assert ds.y_train.shape == (1348,) and ds.y_test.shape == (449,)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert ds.num_classes == 10
  assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0


def test_digits_split_is_a_partition_of_sklearns_data():
  ds = data.load_digits(seed=3)
  digits = sk_load_digits()
  both = np.concatenate([ds.x_train, ds.x_test])
  assert _rows(both) == _rows((digits.images / 16.0).astype(np.float32)[..., None])
  labels = np.concatenate([ds.y_train, ds.y_test])
  assert np.array_equal(np.bincount(labels), np.bincount(digits.target))


def test_digits_are_sklearns_exactly_with_or_without_its_file(monkeypatch):
  digits = sk_load_digits()
  images, labels = data._digits()  # read from the file scikit-learn ships
  np.testing.assert_array_equal(images, digits.images)
  np.testing.assert_array_equal(labels, digits.target)
  # Where that file has moved, through scikit-learn itself.
  monkeypatch.setattr(data.os.path, 'exists', lambda path: False)
  images, labels = data._digits()
  np.testing.assert_array_equal(images, digits.images)
  np.testing.assert_array_equal(labels, digits.target)


def test_digits_split_depends_only_on_seed():
  a, b, c = data.load_digits(seed=1), data.load_digits(seed=1), data.load_digits(seed=2)
  assert np.array_equal(a.x_test, b.x_test) and np.array_equal(a.y_train, b.y_train)
  assert not np.array_equal(a.y_test, c.y_test)


def test_digits_rejects_bad_test_fraction():
  with pytest.raises(ValueError, match='test_fraction=1.0'):
    data.load_digits(test_fraction=1.0)


def test_batches_cover_each_epoch_once_and_are_reproducible():
  n, batch = 10, 3  # 3 full batches per epoch; one example is dropped each epoch
  epoch0 = [data.batch_indices(7, step, n, batch) for step in range(3)]
  flat = np.concatenate(epoch0)
  assert len(set(flat.tolist())) == 9 and flat.min() >= 0 and flat.max() < n
  again = [data.batch_indices(7, step, n, batch) for step in range(3)]
  assert all(np.array_equal(a, b) for a, b in zip(epoch0, again, strict=True))
  # The epoch's order is numpy's permutation for seed (7, epoch).
  expected = np.random.default_rng((7, 1)).permutation(n)[3:6]
  assert np.array_equal(data.batch_indices(7, 4, n, batch), expected)
  assert not np.array_equal(data.batch_indices(8, 0, n, batch), epoch0[0])


def test_get_batch_returns_the_indexed_examples():
  ds = data.load_digits()
  x, y = data.get_batch(ds, 0, 5, 32)
  index = data.batch_indices(0, 5, len(ds.y_train), 32)
  assert np.array_equal(x, ds.x_train[index]) and np.array_equal(y, ds.y_train[index])


def test_batch_size_larger_than_dataset_is_an_error():
  with pytest.raises(ValueError, match='batch_size=20'):
    data.batch_indices(0, 0, 10, 20)


def _save(tmp_path, **arrays):
  path = str(tmp_path / 'd.npz')
  np.savez(path, **arrays)
  return path


def _arrays():
  rng = np.random.default_rng(0)
  return {
    'x_train': rng.normal(size=(20, 4, 4)),
    'y_train': np.arange(20) % 3,
    'x_test': rng.normal(size=(6, 4, 4)),
    'y_test': np.arange(6) % 5,
  }


def test_npz_round_trip(tmp_path):
  arrays = _arrays()
  ds = data.load_npz(_save(tmp_path, **arrays))
  assert np.allclose(ds.x_train, arrays['x_train']) and ds.x_train.dtype == np.float32
  assert np.array_equal(ds.y_test, arrays['y_test'])
  assert ds.num_classes == 5  # the largest label (4, in y_test) plus one
  assert data.load_dataset('npz', _save(tmp_path, **arrays)).x_test.shape == (6, 4, 4)


def test_npz_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match='no such file'):
    data.load_npz(str(tmp_path / 'absent.npz'))


def test_npz_missing_keys(tmp_path):
  arrays = _arrays()
  del arrays['y_test']
  with pytest.raises(ValueError, match=r"missing arrays \['y_test'\]"):
    data.load_npz(_save(tmp_path, **arrays))


@pytest.mark.parametrize(
  'key, value, message',
  [
    ('y_train', np.arange(19) % 3, r'x_train has shape \(20, 4, 4\) but y_train has shape \(19,\)'),
    ('x_test', np.zeros((6, 4, 5)), r'x_train has input shape \(4, 4\) but x_test has \(4, 5\)'),
    ('y_test', np.eye(6), 'not one-hot'),
    ('y_test', np.linspace(0, 1, 6), 'integer class ids'),
  ],
)
def test_npz_bad_shapes(tmp_path, key, value, message):
  arrays = _arrays()
  arrays[key] = value
  with pytest.raises(ValueError, match=message):
    data.load_npz(_save(tmp_path, **arrays))


def test_unknown_dataset_name():
  with pytest.raises(ValueError, match="data.name='mnist'"):
    data.load_dataset('mnist')


@pytest.mark.parametrize(
  'content, kind',
  [
    (b'hello, these are not arrays\n', 'is not a .npz file'),
    (b'\x93NUMPY\x01\x00v\x00', 'is a single .npy array'),
  ],
)
def test_a_file_that_is_no_npz_says_so(tmp_path, content, kind):
  path = tmp_path / 'data.txt'
  path.write_bytes(content)
  with pytest.raises(ValueError) as err:
    data.load_npz(str(path))
  # Not numpy's "contains pickled (object) data".
  assert str(err.value).startswith(f'data.path={str(path)!r} {kind} (a .npz file is a zip')
  assert 'numpy.savez' in str(err.value)


def test_a_damaged_npz_and_object_arrays_are_named(tmp_path):
  good = _save(tmp_path, **_arrays())
  with open(good, 'rb') as f:
    blob = f.read()
  damaged = tmp_path / 'cut.npz'
  damaged.write_bytes(blob[: len(blob) // 2])
  with pytest.raises(ValueError, match=r"data.path='.*cut.npz' cannot be read as a .npz file"):
    data.load_npz(str(damaged))
  arrays = _arrays()
  arrays['y_train'] = np.array([{'a': 1}] * 20, dtype=object)
  with pytest.raises(ValueError, match=r"data.path='.*d.npz' cannot be read as a .npz file"):
    data.load_npz(_save(tmp_path, **arrays))


def test_a_directory_and_non_finite_inputs_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"data.path='.*': no such file"):
    data.load_npz(str(tmp_path))
  arrays = _arrays()
  arrays['x_train'][3, 1, 1] = np.nan
  arrays['x_test'][0, 0, 0] = 1e39  # beyond float32
  with pytest.raises(ValueError, match='x_train has 1 NaN or infinite values'):
    data.load_npz(_save(tmp_path, **arrays))
  arrays['x_train'][3, 1, 1] = 0.0
  with pytest.raises(ValueError, match='x_test has 1 NaN or infinite values'):
    data.load_npz(_save(tmp_path, **arrays))


@pytest.mark.parametrize(
  'label, dtype',
  [
    (2**16, np.int64),  # one past the largest class id allowed (65,535)
    (50_000_000, np.int64),  # an output layer of 50M logits: killed for memory
    (2**40, np.int64),  # int32 would wrap it silently
    (2**63 + 5, np.uint64),  # beyond int64
  ],
)
def test_labels_beyond_the_class_limit_are_named(tmp_path, label, dtype):
  arrays = _arrays()
  arrays['y_train'] = (np.arange(20) % 3).astype(dtype)
  arrays['y_train'][7] = label
  path = _save(tmp_path, **arrays)
  with pytest.raises(ValueError) as err:
    data.load_npz(path)
  assert str(err.value) == (
    f'data.path={path!r}: y_train holds the class id {label}, so the model would need '
    f'{label + 1:,} outputs (at most 65,536); labels are class indices 0..num_classes-1: '
    'relabel them, e.g. with numpy.unique(y, return_inverse=True).'
  )


def test_the_largest_class_id_allowed_loads(tmp_path):
  arrays = _arrays()
  arrays['y_test'] = np.full(6, 2**16 - 1, np.uint64)
  dataset = data.load_npz(_save(tmp_path, **arrays))
  assert dataset.num_classes == 65_536 and dataset.y_test.dtype == np.int32
  assert dataset.y_test.tolist() == [65_535] * 6


def test_bfloat16_inputs_load_as_their_float32_values(tmp_path):
  arrays = _arrays()
  x = np.full((20, 4, 4), 1 / 3)
  x[0, 0, :3] = [1.5, -2.0, 0.15625]  # exact in bfloat16's 8 significant bits
  arrays['x_train'] = x.astype(ml_dtypes.bfloat16)
  arrays['x_test'] = np.ones((6, 4, 4), ml_dtypes.bfloat16)
  dataset = data.load_npz(_save(tmp_path, **arrays))
  assert dataset.x_train.dtype == np.float32
  assert dataset.x_train[0, 0, :3].tolist() == [1.5, -2.0, 0.15625]
  # 1/3 = 1.0101010|1010...b * 2**-2 rounds up to 1.0101011b * 2**-2 = 0.333984375.
  assert dataset.x_train[5, 2, 1] == 0.333984375
  assert dataset.x_test.tolist() == np.ones((6, 4, 4)).tolist()


def test_one_byte_raw_inputs_are_named_with_the_fix(tmp_path):
  arrays = _arrays()
  arrays['x_test'] = np.ones((6, 4, 4), ml_dtypes.float8_e4m3fn)
  with pytest.raises(ValueError, match=r'x_test has dtype \|V1; .* numeric arrays \(raw bytes'):
    data.load_npz(_save(tmp_path, **arrays))
