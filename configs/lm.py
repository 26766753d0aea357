"""A byte-level decoder language model on Python's standard library, GMP to 50% per layer.

Four pre-norm layers under `nn.scan` (RMSNorm, rotary positions, grouped-query
attention, SwiGLU), d_model 128, 128-byte windows, bfloat16 matmuls on float32
params. The text is the interpreter's own standard library (its `.py` files,
split into train and held-out by a hash of each file's path: on every machine,
nothing downloaded); `--config.data.path='notes/**/*.txt'` (or a directory)
trains on your own text instead. Each layer of each stacked kernel gets its own
threshold (`layer_axes_map`); the embedding and the output head stay dense.

    jaxprune-train --config configs/lm.py
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the language model config (`jaxprune-train --config configs/lm.py --help`)."""
  config = train.get_config()
  config.name = 'lm'
  config.data.name = 'text'
  config.data.path = ''  # the standard library's .py files
  config.data.test_fraction = 0.1
  config.data.seq_len = 128
  config.data.test_windows = 128
  config.model.name = 'lm'
  config.model.num_layers = 4
  config.model.d_model = 128
  config.model.num_heads = 4
  config.model.num_kv_heads = 2
  config.model.mlp_dim = 384
  config.model.compute_dtype = 'bfloat16'
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 2e-3
  config.optimizer.weight_decay = 0.01
  config.batch_size = 16
  config.num_steps = 600
  # Dense for 100 steps, the cubic schedule to 50% by step 400, then 200 steps
  # of fine-tuning with the masks fixed.
  config.pruning = train.pruning_config(
    config.pruning,
    begin_pruning_step=100,
    end_pruning_step=400,
    pruning_frequency=25,
    sparsity_function_begin_step=100,
    sparsity_function_end_step=400,
    target_sparsity=0.5,
    threshold_method='exact',
    # The layers' kernels only: the embedding and the head are 9% of the weights
    # and every byte goes through them.
    weight_name_regex='^layers/.*/kernel$',
    # The scanned kernels are (layer, in, out): axis 0 indexes layers.
    layer_axes_map=('layers/.*:1',),
  )
  config.log_every = 25
  config.eval_every = 100
  config.checkpoint_every = 200
  return config
