"""Text for the language model: bytes of files, split into train and held-out by file.

With `data.name='text'` and `data.path=''` the corpus is the `.py` files of the
interpreter's own standard library (`sysconfig.get_paths()['stdlib']`), text
that is on every machine; `data.path` may instead name a directory (every file
under it) or a glob (`'notes/**/*.md'`). A file is held out when a hash of its
path (relative to the corpus root) and `data.seed` falls under
`data.test_fraction`, so no held-out file is ever trained on and the split is
the same on every machine and in every process, with nothing downloaded.

The training windows are the train bytes cut every `seq_len` bytes, each with
its next bytes as labels; batches come from them as from any `Dataset`
(`_data.get_batch`), so a resumed run sees the same windows.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig

import numpy as np

from jaxprune_train._data import Dataset
from jaxprune_train._lm import VOCAB

_SNIFF_BYTES = 8192  # a NUL byte in a file's head marks it as binary, as git and grep judge


def stdlib_root() -> str:
  """The standard library's directory, whose `.py` files are the default corpus."""
  return sysconfig.get_paths()['stdlib']


def corpus_files(path: str) -> tuple[str, list[str]]:
  """The corpus root and its files, sorted, for `data.path`.

  Args:
    path: '' for the standard library's `.py` files (without site-packages), a
      directory (every file under it, hidden ones left out), or a glob
      (`**` matches folders at any depth).

  Returns:
    `(root, files)`: the directory the files' names are hashed relative to, and the files.

  Raises:
    ValueError: no file matches.
  """
  if not path:
    root, suffix = stdlib_root(), '.py'
    skip = {'site-packages', '__pycache__'}
  elif os.path.isdir(path):
    root, suffix, skip = path, '', set()
  else:
    root = os.path.dirname(path.split('*', 1)[0].split('?', 1)[0].split('[', 1)[0]) or '.'
    found = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
    if not found:
      raise ValueError(
        f'data.path={path!r}: no file matches; give a directory of text files or a glob '
        "such as 'notes/**/*.txt' (relative to the working directory), or '' for the "
        "standard library's .py files."
      )
    return root, found
  found = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith('.'))
    found += [
      os.path.join(folder, name)
      for name in sorted(names)
      if name.endswith(suffix) and not name.startswith('.')
    ]
  if not found:
    raise ValueError(
      f'data.path={path or root!r}: the directory holds no files; give a directory of '
      "text files or a glob such as 'notes/**/*.txt'."
    )
  return root, found


def _held_out(relative: str, seed: int, fraction: float) -> bool:
  digest = hashlib.sha256(f'{seed}:{relative}'.encode()).digest()
  return int.from_bytes(digest[:8], 'big') < fraction * 2**64


def _is_text(content: bytes) -> bool:
  if b'\0' in content[:_SNIFF_BYTES]:
    return False
  try:
    content.decode('utf-8')
  except UnicodeDecodeError:
    return False
  return True


def read_split(path: str, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
  """The corpus' bytes as `(train, held_out)` uint8 arrays, files joined by newlines.

  In the standard library a file that is not UTF-8 text (a few test files of
  other encodings) is left out; in a corpus of your own it is an error.

  Raises:
    ValueError: a file cannot be read or is not text, the corpus is empty, or
      one split has no text; the message names `data.path` and the fix.
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'data.test_fraction={test_fraction!r}: must be in (0, 1), e.g. 0.1.')
  root, files = corpus_files(path)
  shown = path or root
  parts: dict[bool, list[bytes]] = {False: [], True: []}
  for name in files:
    try:
      with open(name, 'rb') as f:
        content = f.read()
    except OSError as err:
      raise ValueError(
        f'data.path={shown!r}: {name} cannot be read ({err.strerror}); fix its '
        'permissions, or narrow data.path to files you can read.'
      ) from err
    if not _is_text(content):
      if not path:
        continue
      raise ValueError(
        f'data.path={shown!r}: {name} is not UTF-8 text (binary, or another encoding); '
        'narrow data.path to text files (e.g. a glob such as "notes/**/*.txt"), or '
        're-encode the file as UTF-8.'
      )
    if content:
      parts[_held_out(os.path.relpath(name, root), seed, test_fraction)].append(content)
  if not parts[False] and not parts[True]:
    raise ValueError(
      f'data.path={shown!r}: all {len(files)} files are empty; give files with text in them.'
    )
  for held, split in ((False, 'training'), (True, 'held-out')):
    if not parts[held]:
      raise ValueError(
        f'data.path={shown!r}: none of the {len(files)} non-empty files falls in the '
        f'{split} split (a file is held out when a hash of its path falls under '
        f'data.test_fraction={test_fraction}); give more files, or change data.test_fraction '
        'or data.seed.'
      )
  return tuple(np.frombuffer(b'\n'.join(parts[held]), np.uint8) for held in (False, True))


def windows(text: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """`(inputs, labels)`, each (n, seq_len): `text` cut every `seq_len` bytes, labels one on.

  Both are read-only views of `text` (no copy): a batch copies only its own rows.
  """
  count = (len(text) - 1) // seq_len
  inputs = np.lib.stride_tricks.sliding_window_view(text[:-1], seq_len)[::seq_len][:count]
  labels = np.lib.stride_tricks.sliding_window_view(text[1:], seq_len)[::seq_len][:count]
  return inputs, labels


def load_text(
  path: str, seq_len: int, test_windows: int, seed: int = 0, test_fraction: float = 0.1
) -> Dataset:
  """The corpus as a `Dataset` of byte windows for next-byte prediction.

  Args:
    path: `data.path`: '' (the standard library's `.py` files), a directory or a glob.
    seq_len: bytes per window.
    test_windows: how many held-out windows are evaluated, evenly spaced over
      the held-out bytes (all of them when there are fewer).
    seed: mixed into the hash that splits the files.
    test_fraction: the share of the files held out, in (0, 1).

  Returns:
    A `Dataset` whose inputs and labels are uint8 arrays (n, seq_len); 256 classes.

  Raises:
    ValueError: the corpus is empty or unreadable, or a split is shorter than one window.
  """
  train, held_out = read_split(path, seed, test_fraction)
  for text, split in ((train, 'training'), (held_out, 'held-out')):
    if len(text) <= seq_len:
      raise ValueError(
        f'data.path={path or stdlib_root()!r}: the {split} text has {len(text)} bytes, '
        f'not enough for one window of data.seq_len={seq_len} bytes and its next byte; '
        'give more text, or lower data.seq_len.'
      )
  x_train, y_train = windows(train, seq_len)
  x_test, y_test = windows(held_out, seq_len)
  if len(x_test) > test_windows:
    chosen = np.linspace(0, len(x_test) - 1, test_windows).round().astype(int)
    x_test, y_test = x_test[chosen], y_test[chosen]
  return Dataset(
    x_train, y_train, np.ascontiguousarray(x_test), np.ascontiguousarray(y_test), VOCAB
  )
