"""The default config of `jaxprune-train`: a 300-100 MLP on digits, GMP to 90%.

This file is also an ml_collections config file (it has `get_config()`), the
default of the `--config` flag; `configs/*.py` start from it.
"""

from __future__ import annotations

import warnings
from typing import Any

import ml_collections

import jaxprune
from jaxprune._config import hparams as hparams_lib


def pruning_config(
  base: ml_collections.ConfigDict | None = None, **overrides: Any
) -> ml_collections.ConfigDict:
  """jaxprune's pruning hparams with `overrides`, list fields as tuples.

  ml_collections' command-line flags can override tuple fields but not list
  fields, so the map fields are stored as tuples; this is what makes
  `--config.pruning.weight_sparsity_map="['Dense_0/kernel:0.5']"` work.

  Args:
    base: hparams to start from; `jaxprune.get_pruning_hparams()` if None.
    **overrides: field values to set.

  Returns:
    A new, validated ConfigDict (a `PruningConfig`) whose given fields are `base`'s and
    the overrides'; ml_collections' command-line overrides add theirs.
  """
  values = (base if base is not None else jaxprune.get_pruning_hparams()).to_dict()
  unknown = sorted(set(overrides) - set(values))
  if unknown:
    raise ValueError(f'pruning fields {unknown} do not exist; known: {sorted(values)}.')
  values.update(overrides)
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  # An empty map given as "[]" is stored as the default one, so that the two compare equal.
  values.update({k: ('',) for k, v in values.items() if k.endswith('_map') and v == ()})
  given = set(overrides) | (hparams_lib.given_fields(base) if base is not None else set())
  hparams = hparams_lib.PruningConfig(values, given=given)
  hparams_lib.freeze(hparams)
  return hparams


def parse_pruning_flag(text: str, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Applies a TF HParams string (`--pruning_hparams`) on top of `base`.

  Args:
    text: e.g. 'target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]'.
    base: the config's pruning block (tuple map fields).

  Returns:
    The new pruning block, map fields as tuples.
  """
  # parse_hparams takes list-typed map fields, as jaxprune's defaults have.
  as_lists = {k: list(v) if isinstance(v, tuple) else v for k, v in base.to_dict().items()}
  given = hparams_lib.given_fields(base)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # pruning_config checks the result, and warns once
    parsed = jaxprune.parse_hparams(text, base=hparams_lib.PruningConfig(as_lists, given=given))
  return pruning_config(parsed)


# What each field of the job's config means: shown by `jaxprune-train --help`
# (with the values of the config given, or the defaults below). The `pruning`
# block holds jaxprune's pruning hparams, documented in docs/explanation/semantics.md.
FIELD_HELP = {
  'name': 'name of the run; the default --workdir is runs/<name>',
  'seed': 'seed of the params init and of the batch order',
  'data.name': "'digits' (scikit-learn's bundled 8x8 digits), 'npz' (your file) or 'text' "
  '(bytes of text files, for model.name=lm)',
  'data.path': "npz: the .npz file (arrays x_train, y_train, x_test, y_test); text: '' for "
  "the Python standard library's .py files, or a directory or glob of your text files",
  'data.test_fraction': 'digits: share of the images held out; text: share of the files held '
  'out (by a hash of their path); in (0, 1)',
  'data.seed': 'digits: seed of the train/test split; text: mixed into the hash that splits files',
  'data.seq_len': 'text: bytes per training window (the context the model sees)',
  'data.test_windows': 'text: held-out windows evaluated, evenly spaced (all when fewer)',
  'model.name': "'mlp', 'cnn' or 'lm' (a byte-level decoder language model; data.name=text)",
  'model.features': 'hidden widths (mlp) or conv channels (cnn), e.g. "(300, 100)"',
  'model.dense': 'cnn only: width of the hidden dense layer',
  'model.num_layers': 'lm only: decoder layers, run under nn.scan (stacked kernels)',
  'model.d_model': 'lm only: width of the residual stream, a multiple of num_heads',
  'model.num_heads': 'lm only: query heads (the head width d_model / num_heads must be even)',
  'model.num_kv_heads': 'lm only: key/value heads (grouped-query attention), divides num_heads',
  'model.mlp_dim': 'lm only: hidden width of the SwiGLU MLP',
  'model.compute_dtype': "lm only: dtype of the matmuls, 'bfloat16' or 'float32' (params are "
  'float32)',
  'optimizer.name': "'adam', 'adamw' or 'sgd'",
  'optimizer.learning_rate': 'step size, a finite number > 0',
  'optimizer.momentum': 'sgd only: momentum in [0, 1); 0 for plain SGD',
  'optimizer.weight_decay': 'adamw only: decoupled weight decay >= 0',
  'batch_size': 'training examples per step (a multiple of the mesh data size)',
  'mesh_shape': '(data, model) device counts, e.g. "(2, 4)"; () runs on one device',
  'num_steps': 'training steps in all; rerun with a larger value to extend a run',
  'prune': 'False trains the dense model only',
  'pruning': "jaxprune's pruning hparams (TF model_pruning names; "
  'docs/explanation/semantics.md#hyperparameters)',
  'log_every': 'steps between train-metric records (metrics.jsonl, TensorBoard)',
  'eval_every': 'steps between test-set evaluations',
  'checkpoint_every': 'steps between checkpoints (one is also written at the end)',
  'max_checkpoints_to_keep': 'how many of the newest checkpoints to keep, at least 1',
  'progress_bar': 'show a tqdm progress bar',
  'tensorboard': 'write TensorBoard events (needs tensorboardX; skipped if missing)',
  'plots': 'write sparsity.png, accuracy.png and layer_sparsity.png',
  'channels.enabled': 'prune whole coupled channels (target_sparsity = share of the channels '
  'of each group), then write the smaller model to pruned_model.bin',
  'channels.round_to': 'channels only: each group keeps a multiple of this many channels',
  'channels.min_channels': 'channels only: each group keeps at least this many channels',
}

# What each pruning hparam means, for `--help` (docs/explanation/semantics.md has
# the whole rule). Map fields take lists of 'regex:value'.


def get_config() -> ml_collections.ConfigDict:
  """The default run: LeNet-300-100 on digits, pruned gradually to 90% sparsity.

  Returns:
    The config; `FIELD_HELP` says what each field means.
  """
  config = ml_collections.ConfigDict()
  config.name = 'digits_mlp'
  config.seed = 0
  config.data = ml_collections.ConfigDict(
    {
      'name': 'digits',
      'path': '',
      'test_fraction': 0.25,
      'seed': 0,
      'seq_len': 128,
      'test_windows': 256,
    }
  )
  config.model = ml_collections.ConfigDict(
    {
      'name': 'mlp',
      'features': (300, 100),
      'dense': 64,
      'num_layers': 4,
      'd_model': 128,
      'num_heads': 4,
      'num_kv_heads': 2,
      'mlp_dim': 384,
      'compute_dtype': 'bfloat16',
    }
  )
  config.optimizer = ml_collections.ConfigDict(
    {'name': 'adam', 'learning_rate': 1e-3, 'momentum': 0.9, 'weight_decay': 1e-4}
  )
  config.batch_size = 64
  config.mesh_shape = ()
  config.num_steps = 3000
  config.prune = True
  # Dense for 500 steps (the "dense at start" accuracy is measured at step
  # 500), then the Zhu & Gupta cubic schedule to 90% by step 2000, then 1000
  # steps of fine-tuning with the masks frozen in place.
  config.pruning = pruning_config(
    begin_pruning_step=500,
    end_pruning_step=2000,
    pruning_frequency=50,
    sparsity_function_begin_step=500,
    sparsity_function_end_step=2000,
    target_sparsity=0.9,
    # The exact k-th magnitude keeps round(N * 0.1) weights of each kernel,
    # so the run ends at 90.0% rather than one histogram bin short of it.
    threshold_method='exact',
  )
  config.log_every = 20
  config.eval_every = 250
  config.checkpoint_every = 500
  config.max_checkpoints_to_keep = 2
  config.progress_bar = True
  config.tensorboard = True
  config.plots = True
  # Weights by default; configs/digits_cnn_channels.py prunes whole channels.
  config.channels = ml_collections.ConfigDict({'enabled': False, 'round_to': 8, 'min_channels': 1})
  return config
