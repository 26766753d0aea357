"""A small CNN on digits (two 3x3 convs, a 64-wide dense layer), GMP to 90%.

The first conv has only 144 weights and sees the raw pixels, so it is pruned
to 50% only (`weight_sparsity_map`); every other kernel goes to 90%.

    jaxprune-train --config configs/digits_cnn.py
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the CNN config; conv kernels and dense kernels are all pruned."""
  config = train.get_config()
  config.name = 'digits_cnn'
  config.model.name = 'cnn'
  config.model.features = (16, 32)
  config.model.dense = 64
  config.pruning = train.pruning_config(config.pruning, weight_sparsity_map=('Conv_0/kernel:0.5',))
  return config
