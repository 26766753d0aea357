"""The main job's language model (configs/lm.py): text data, training, per-layer pruning,
bits per byte, resume, a 2-device data mesh, and one-line errors for bad corpora.

A tiny model (2 layers, d_model 32, 32-byte windows) on a small corpus written
into the test's directory keeps each run to seconds.
"""

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import cpu_devices
import jax
import numpy as np
import pytest

from jaxprune_train import _loop as loop
from jaxprune_train import _text as text
from jaxprune_train._errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_STEPS = 30
SEQ_LEN = 32


def _corpus(folder) -> str:
  """24 small files of learnable text (repeated phrases with counters); returns the glob."""
  os.makedirs(folder, exist_ok=True)
  animals = ['fox', 'dog', 'cat', 'owl', 'elk', 'ant']
  for i in range(24):
    lines = [
      f'the quick {animals[(i + j) % 6]} number {j % 10} jumps over the lazy {animals[j % 6]}.'
      for j in range(40)
    ]
    with open(os.path.join(folder, f'f{i:02d}.txt'), 'w') as f:
      f.write('\n'.join(lines) + '\n')
  return os.path.join(str(folder), '*.txt')


def _load_lm_config():
  spec = importlib.util.spec_from_file_location('lm_config', os.path.join(REPO, 'configs/lm.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def tiny_config(corpus: str, num_steps: int = NUM_STEPS, mesh_shape=()):
  """configs/lm.py shrunk: 2 layers, d_model 32, 32-byte windows, 50% by step 20."""
  import jaxprune_train as train

  config = _load_lm_config()
  config.data.path = corpus
  config.data.test_fraction = 0.3
  config.data.seq_len = SEQ_LEN
  config.data.test_windows = 16
  config.model.num_layers = 2
  config.model.d_model = 32
  config.model.mlp_dim = 64
  config.batch_size = 8
  config.num_steps = num_steps
  config.log_every = 5
  config.eval_every = 10
  config.checkpoint_every = 10
  config.progress_bar = False
  config.tensorboard = False
  config.mesh_shape = mesh_shape
  config.pruning = train.pruning_config(
    config.pruning,
    begin_pruning_step=5,
    sparsity_function_begin_step=5,
    end_pruning_step=20,
    sparsity_function_end_step=20,
    pruning_frequency=5,
  )
  return config


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  return _corpus(tmp_path_factory.mktemp('corpus'))


@pytest.fixture(scope='module')
def finished(corpus, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('lm') / 'run')
  return loop.train(tiny_config(corpus), workdir)


def test_the_files_are_split_by_a_hash_of_their_path(corpus):
  folder = os.path.dirname(corpus)
  names = sorted(os.listdir(folder))
  held = []
  for name in names:
    digest = hashlib.sha256(f'0:{name}'.encode()).digest()
    if int.from_bytes(digest[:8], 'big') < 0.3 * 2**64:
      held.append(name)
  assert 0 < len(held) < len(names)

  def joined(chosen):
    parts = []
    for name in chosen:
      with open(os.path.join(folder, name), 'rb') as f:
        parts.append(f.read())
    return b'\n'.join(parts)

  train_bytes, held_bytes = text.read_split(corpus, seed=0, test_fraction=0.3)
  assert held_bytes.tobytes() == joined(held)
  assert train_bytes.tobytes() == joined([n for n in names if n not in held])


def test_windows_are_the_text_cut_every_seq_len_bytes_with_next_bytes_as_labels():
  data = np.arange(11, dtype=np.uint8)
  inputs, labels = text.windows(data, 3)
  # (11 - 1) // 3 = 3 windows: bytes 0-2, 3-5, 6-8; labels one byte on.
  assert inputs.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
  assert labels.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_the_default_corpus_is_the_standard_librarys_py_files():
  root, files = text.corpus_files('')
  assert root == text.stdlib_root()
  assert len(files) > 100
  assert all(f.endswith('.py') and f.startswith(root) for f in files)
  assert not any('site-packages' in f for f in files)


@pytest.mark.slow
def test_tiny_lm_trains_and_prunes_every_layer_to_its_target(finished):
  history = finished.history
  losses = [r['loss'] for r in history if 'loss' in r]
  assert losses[-1] < 0.7 * losses[0]
  # Exact thresholds keep round(0.5 * n) weights of each layer of each stacked kernel.
  params = finished.state.params['layers']
  kernels = {
    name: np.asarray(params[name]['kernel']) for name in params if 'kernel' in params[name]
  }
  assert sorted(kernels) == ['down', 'gate', 'k', 'o', 'q', 'up', 'v']
  for name, kernel in kernels.items():
    assert kernel.shape[0] == 2, name
    for layer in kernel:
      assert np.count_nonzero(layer) == layer.size // 2, name
  # The embedding and the head are left dense (weight_name_regex).
  assert np.count_nonzero(finished.state.params['embed']['embedding']) == 256 * 32
  rows = [leaf.name for leaf in finished.report.leaves]
  assert 'layers/q/kernel[0]' in rows and 'layers/q/kernel[1]' in rows and len(rows) == 14


@pytest.mark.slow
def test_the_report_gives_held_out_bits_per_byte(finished, corpus):
  from jaxprune_train._lm import DecoderLM

  dataset = text.load_text(corpus, SEQ_LEN, 16, seed=0, test_fraction=0.3)
  model = DecoderLM(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64)
  logits = np.asarray(model.apply({'params': finished.state.params}, dataset.x_test), np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  picked = np.take_along_axis(log_probs, dataset.y_test[..., None].astype(int), -1)
  expected = -picked.mean() / math.log(2)
  assert finished.report.bits_per_byte == pytest.approx(expected, rel=1e-4)
  report = open(os.path.join(finished.workdir, 'report.txt')).read()
  assert f'final (step {NUM_STEPS}) {expected:.4f}' in report
  assert 'held-out bits per byte: dense at start of pruning (step 5)' in report
  records = [json.loads(line) for line in open(os.path.join(finished.workdir, 'metrics.jsonl'))]
  last = [r for r in records if 'test_bits_per_byte' in r][-1]
  assert last['test_bits_per_byte'] == pytest.approx(expected, rel=1e-4)
  assert os.path.exists(os.path.join(finished.workdir, 'bits_per_byte.png'))


@pytest.mark.slow
def test_an_interrupted_and_resumed_run_equals_the_uninterrupted_one(finished, corpus, tmp_path):
  workdir = str(tmp_path / 'resumed')
  loop.train(tiny_config(corpus, num_steps=15), workdir)
  resumed = loop.train(tiny_config(corpus), workdir)
  for a, b in zip(jax.tree.leaves(finished.state), jax.tree.leaves(resumed.state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


CLI_CONFIG = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from train_lm_test import tiny_config


def get_config():
  return tiny_config({{corpus!r}}, mesh_shape=(2, 1))
"""


@pytest.mark.slow
def test_a_two_device_data_mesh_run_from_the_command_line(finished, corpus, tmp_path):
  (tmp_path / 'tiny_lm.py').write_text(CLI_CONFIG.format(corpus=corpus))
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'jaxprune_train',
      '--config',
      str(tmp_path / 'tiny_lm.py'),
      '--workdir',
      str(tmp_path / 'run'),
    ],
    capture_output=True,
    text=True,
    env=cpu_devices.env(2),
    cwd=tmp_path,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.count('compilation cache in ') == 1
  assert 'held-out bits per byte' in result.stdout
  assert 'bits_per_byte.png' in result.stdout
  records = [json.loads(line) for line in open(tmp_path / 'run' / 'metrics.jsonl')]
  final = [r for r in records if 'test_bits_per_byte' in r][-1]
  # The same batches, split over two devices: the same model up to float rounding.
  assert final['test_bits_per_byte'] == pytest.approx(finished.report.bits_per_byte, rel=0.02)
  assert [r for r in records if 'achieved_sparsity' in r][-1]['achieved_sparsity'] == 0.5


def _error(config) -> str:
  with pytest.raises(ConfigError) as caught:
    loop.train(config)
  message = str(caught.value)
  assert '\n' not in message
  return message


def test_a_glob_that_matches_nothing_is_one_line(tmp_path):
  message = _error(tiny_config(str(tmp_path / 'none' / '*.txt')))
  assert 'no file matches' in message and 'data.path=' in message


def test_a_corpus_of_empty_files_is_one_line(tmp_path):
  for name in 'ab':
    (tmp_path / f'{name}.txt').write_text('')
  message = _error(tiny_config(str(tmp_path / '*.txt')))
  assert 'all 2 files are empty' in message


def test_a_binary_file_is_one_line_naming_it(tmp_path):
  (tmp_path / 'a.txt').write_text('hello\n' * 100)
  (tmp_path / 'b.bin').write_bytes(bytes(range(256)) * 4)
  message = _error(tiny_config(str(tmp_path)))
  assert 'b.bin is not UTF-8 text' in message and 'narrow data.path' in message


def test_an_empty_directory_is_one_line(tmp_path):
  message = _error(tiny_config(str(tmp_path)))
  assert 'holds no files' in message


def test_a_split_without_files_is_one_line(tmp_path):
  (tmp_path / 'only.txt').write_text('hello\n' * 100)
  message = _error(tiny_config(str(tmp_path)))
  assert 'falls in the' in message and 'data.test_fraction' in message


def test_a_layer_axis_out_of_range_is_one_line(corpus):
  import jaxprune_train as train

  config = tiny_config(corpus)
  config.pruning = train.pruning_config(config.pruning, layer_axes_map=('layers/.*:3',))
  message = _error(config)
  assert "layer_axes_map: leaf 'layers/" in message and '3 layer axes' in message


def test_lm_and_text_go_together():
  import jaxprune_train as train

  config = train.get_config()
  config.model.name = 'lm'
  message = _error(config)
  assert "config.model.name='lm' needs config.data.name='text'" in message


@pytest.mark.slow
def test_help_lists_the_bundled_configs():
  result = subprocess.run(
    [sys.executable, '-m', 'jaxprune_train', '--help'],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr
  assert 'Bundled configs' in result.stdout
  assert 'configs/lm.py  ' in result.stdout and 'configs/digits_mlp.py  ' in result.stdout
