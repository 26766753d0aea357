"""Datasets for the main job: scikit-learn's bundled digits, or a user's `.npz`.

Batches are a pure function of `(seed, step)`: the order of each epoch is a
permutation drawn from `numpy.random.default_rng((seed, epoch))`, so a run
resumed from a checkpoint sees exactly the batches an uninterrupted run sees.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from typing import NamedTuple

import ml_dtypes
import numpy as np

NPZ_KEYS = ('x_train', 'y_train', 'x_test', 'y_test')
# The model has one output per class id up to the largest label; beyond this
# many, a label is far more likely a raw id (or garbage) than a class index,
# and the output layer would not fit in memory long before int32 runs out.
MAX_CLASSES = 2**16
_ZIP_MAGIC = b'PK\x03\x04'  # what numpy.savez writes first


class Dataset(NamedTuple):
  """A classification dataset held in host memory (or bytes and their next bytes).

  Attributes:
    x_train: float32 inputs, shape (n_train, *input_shape); text: uint8 windows
      (n_train, seq_len).
    y_train: int32 labels in [0, num_classes), shape (n_train,); text: uint8
      next bytes (n_train, seq_len).
    x_test: float32 inputs, shape (n_test, *input_shape).
    y_test: int32 labels, shape (n_test,).
    num_classes: number of classes.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int


def load_digits(seed: int = 0, test_fraction: float = 0.25) -> Dataset:
  """Loads scikit-learn's 1,797 8x8 handwritten digits (bundled, no download).

  Args:
    seed: seed of the train/test split.
    test_fraction: fraction of the images held out for testing, in (0, 1).

  Returns:
    A `Dataset` with images of shape (8, 8, 1) scaled to [0, 1].
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'data.test_fraction={test_fraction!r}: must be in (0, 1), e.g. 0.25.')
  images, labels = _digits()
  images = (images / 16.0).astype(np.float32)[..., None]
  labels = labels.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(labels))
  n_test = int(round(test_fraction * len(labels)))
  test, train = order[:n_test], order[n_test:]
  return Dataset(images[train], labels[train], images[test], labels[test], 10)


def _digits() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's digits: 1,797 8x8 images (values 0-16, float64) and their labels.

  Read from the file scikit-learn ships, as its `load_digits` reads it, without
  importing scikit-learn (a second of every run's start); through scikit-learn
  if that file has moved. Not installed: the ImportError names the package.
  """
  spec = importlib.util.find_spec('sklearn')
  if spec is not None and spec.submodule_search_locations:
    path = os.path.join(
      list(spec.submodule_search_locations)[0], 'datasets', 'data', 'digits.csv.gz'
    )
    if os.path.exists(path):
      table = np.loadtxt(path, delimiter=',')  # 64 pixels, then the label, per row
      return table[:, :-1].reshape(-1, 8, 8), table[:, -1]
  from sklearn.datasets import load_digits as sk_load_digits

  digits = sk_load_digits()
  return digits.images, digits.target


def _read_npz(path: str, fix: str) -> dict[str, np.ndarray]:
  """The arrays `NPZ_KEYS` of `path`; a ValueError naming `data.path` if it is no .npz file."""
  try:
    with open(path, 'rb') as f:
      head = f.read(6)
  except OSError as err:
    raise ValueError(f'data.path={path!r} cannot be read ({err.strerror}); {fix}.') from err
  if not head.startswith(_ZIP_MAGIC):
    # np.load would fall back to unpickling it and blame "pickled (object) data".
    kind = 'a single .npy array' if head.startswith(b'\x93NUMPY') else 'not a .npz file'
    raise ValueError(f'data.path={path!r} is {kind} (a .npz file is a zip archive); {fix}.')
  try:
    with np.load(path, allow_pickle=False) as npz:
      missing = [key for key in NPZ_KEYS if key not in npz.files]
      if missing:
        raise KeyError(
          f'missing arrays {missing}; the file has {sorted(npz.files)} and needs {list(NPZ_KEYS)}'
        )
      return {key: _named_dtype(npz[key]) for key in NPZ_KEYS}
  except KeyError as err:
    raise ValueError(f'data.path={path!r}: {err.args[0]}.') from None
  except (OSError, zipfile.BadZipFile, ValueError) as err:
    # A damaged archive, or object arrays that would need pickle.
    raise ValueError(
      f'data.path={path!r} cannot be read as a .npz file ({err}); {fix} from numeric arrays.'
    ) from err


def _named_dtype(array: np.ndarray) -> np.ndarray:
  """`array`, with raw 2-byte values (how numpy.savez writes bfloat16) viewed as bfloat16.

  A .npy header cannot name ml_dtypes types, and bfloat16 is their only 2-byte one.
  """
  if array.dtype.kind == 'V' and array.dtype.names is None and array.dtype.itemsize == 2:
    return array.view(ml_dtypes.bfloat16)
  return array


def _is_numeric(dtype: np.dtype) -> bool:
  """Whether `dtype` is a number or bool; numpy counts no ml_dtypes float as a number."""
  try:
    ml_dtypes.finfo(dtype)
  except ValueError:
    return np.issubdtype(dtype, np.number) or dtype.kind == 'b'
  return True


def load_npz(path: str) -> Dataset:
  """Loads a user's dataset from a `.npz` file.

  Args:
    path: a file with arrays `x_train`, `y_train`, `x_test`, `y_test`; inputs
      have shape (n, *input_shape) with the same input shape in both splits,
      in any numeric dtype or bfloat16 (which numpy.savez stores as raw 2-byte values),
      labels are integers in [0, num_classes) with shape (n,), num_classes at
      most `MAX_CLASSES`.

  Returns:
    A `Dataset`; `num_classes` is one more than the largest label.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: if it is not a readable .npz file, a key is missing, or the
      shapes or labels do not fit; the message names `data.path` and the fix.
  """
  fix = (
    f'pass the path of a .npz file with arrays {", ".join(NPZ_KEYS)}, e.g. written by numpy.savez'
  )
  if not os.path.isfile(path):
    raise FileNotFoundError(f'data.path={path!r}: no such file; {fix}.')
  arrays = _read_npz(path, fix)
  for key, array in arrays.items():
    if not _is_numeric(array.dtype):
      raw = ' (raw bytes: how numpy.savez stores float8 and int4; save float32)'
      raise ValueError(
        f'data.path={path!r}: {key} has dtype {array.dtype}; inputs and labels must be '
        f'numeric arrays{raw if array.dtype.kind == "V" else ""}.'
      )
  for split in ('train', 'test'):
    x, y = arrays[f'x_{split}'], arrays[f'y_{split}']
    if y.ndim != 1 or y.size == 0:
      raise ValueError(
        f'data.path={path!r}: y_{split} has shape {y.shape}; labels must be a non-empty '
        '1-D array of integer class ids (not one-hot).'
      )
    if x.ndim < 2 or x.shape[0] != y.shape[0]:
      raise ValueError(
        f'data.path={path!r}: x_{split} has shape {x.shape} but y_{split} has shape '
        f'{y.shape}; x_{split} must have shape (n, ...) with n = {y.shape[0]}.'
      )
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
      raise ValueError(
        f'data.path={path!r}: y_{split} must hold non-negative integer class ids; got '
        f'dtype {y.dtype} and minimum {y.min()}.'
      )
    if int(y.max()) >= MAX_CLASSES:
      raise ValueError(
        f'data.path={path!r}: y_{split} holds the class id {int(y.max())}, so the model '
        f'would need {int(y.max()) + 1:,} outputs (at most {MAX_CLASSES:,}); labels are '
        'class indices 0..num_classes-1: relabel them, e.g. with '
        'numpy.unique(y, return_inverse=True).'
      )
    with np.errstate(over='ignore'):
      bad = int(np.sum(~np.isfinite(x.astype(np.float32))))
    if bad:
      raise ValueError(
        f'data.path={path!r}: x_{split} has {bad} NaN or infinite values '
        '(or values beyond float32); clean or rescale the inputs.'
      )
  if arrays['x_train'].shape[1:] != arrays['x_test'].shape[1:]:
    raise ValueError(
      f'data.path={path!r}: x_train has input shape {arrays["x_train"].shape[1:]} but '
      f'x_test has {arrays["x_test"].shape[1:]}; they must match.'
    )
  num_classes = int(max(arrays['y_train'].max(initial=0), arrays['y_test'].max(initial=0))) + 1
  return Dataset(
    arrays['x_train'].astype(np.float32),
    arrays['y_train'].astype(np.int32),
    arrays['x_test'].astype(np.float32),
    arrays['y_test'].astype(np.int32),
    num_classes,
  )


def load_dataset(
  name: str,
  path: str = '',
  seed: int = 0,
  test_fraction: float = 0.25,
  *,
  seq_len: int = 128,
  test_windows: int = 256,
) -> Dataset:
  """Loads the dataset named in a config's `data` block.

  Args:
    name: 'digits', 'npz' or 'text'.
    path: the `.npz` file when `name == 'npz'`; for 'text', '' (the standard
      library's `.py` files), a directory or a glob.
    seed: seed of the digits train/test split, or of the text's split by file.
    test_fraction: fraction of the digits (or of the text files) held out.
    seq_len: text: bytes per window.
    test_windows: text: held-out windows evaluated.

  Returns:
    The `Dataset`; for text, uint8 windows (n, seq_len) and their next bytes.
  """
  if name == 'digits':
    return load_digits(seed, test_fraction)
  if name == 'npz':
    return load_npz(path)
  if name == 'text':
    from jaxprune_train._text import load_text

    return load_text(path, seq_len, test_windows, seed, test_fraction)
  raise ValueError(
    f"data.name={name!r}: unknown dataset; use 'digits', 'npz' (with "
    "data.path='your_file.npz') or 'text'."
  )


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
  """Full batches per epoch (the last partial batch is dropped)."""
  if not 1 <= batch_size <= num_examples:
    raise ValueError(
      f'batch_size={batch_size}: must be between 1 and the number of '
      f'training examples ({num_examples}).'
    )
  return num_examples // batch_size


def batch_indices(seed: int, step: int, num_examples: int, batch_size: int) -> np.ndarray:
  """The indices of the training batch used at `step`.

  Args:
    seed: the run's data seed.
    step: the training step (0-based).
    num_examples: size of the training set.
    batch_size: examples per batch.

  Returns:
    An int array of `batch_size` distinct indices into the training set.
  """
  per_epoch = steps_per_epoch(num_examples, batch_size)
  epoch, position = divmod(step, per_epoch)
  order = np.random.default_rng((seed, epoch)).permutation(num_examples)
  return order[position * batch_size : (position + 1) * batch_size]


def get_batch(
  dataset: Dataset, seed: int, step: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """The training batch the main job takes at `step`: the same batches in a loop of your own.

  Each epoch's order is a permutation of the training set drawn from
  `numpy.random.default_rng((seed, epoch))`, cut into `len(y_train) // batch_size`
  full batches (the last partial batch is dropped), so a batch is a pure function of
  `(seed, step)`: a resumed run, or a loop built from `make_train_step`, sees the batches
  that `train` with the same `seed` and `batch_size` sees.

  Args:
    dataset: the dataset (`load_digits`, `load_npz`).
    seed: the run's seed (the config's `seed`).
    step: the training step, from 0.
    batch_size: examples per batch, from 1 to the number of training examples.

  Returns:
    `(x, y)`: `batch_size` distinct training examples and their labels.

  Raises:
    ValueError: `batch_size` is not between 1 and the number of training examples.
  """
  index = batch_indices(seed, step, len(dataset.y_train), batch_size)
  return dataset.x_train[index], dataset.y_train[index]
