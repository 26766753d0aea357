"""Block sparsity: the MLP's two large kernels pruned in 4x4 / 1x4 blocks.

Blocks are scored by their average magnitude (`block_pooling_function='AVG'`)
and removed whole, which is what block-sparse kernels on accelerators need.

    jaxprune-train --config configs/digits_blocks.py
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the MLP config with per-leaf block shapes from `block_dims_map`."""
  config = train.get_config()
  config.name = 'digits_blocks'
  config.pruning = train.pruning_config(
    config.pruning,
    block_dims_map=('Dense_0/kernel:4x4', 'Dense_1/kernel:1x4'),
    target_sparsity=0.8,
  )
  return config
