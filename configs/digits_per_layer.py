"""Per-layer targets: 95% for the big hidden kernels, 50% for the output layer.

The output layer has only 1,000 weights and every logit depends on it, so it
is pruned gently while the two hidden kernels (49,200 weights) go to 95%.

    jaxprune-train --config configs/digits_per_layer.py
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the MLP config with per-leaf targets from `weight_sparsity_map`."""
  config = train.get_config()
  config.name = 'digits_per_layer'
  config.pruning = train.pruning_config(
    config.pruning,
    weight_sparsity_map=('Dense_[01]/kernel:0.95', 'Dense_2/kernel:0.5'),
  )
  return config
