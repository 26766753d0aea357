"""The digits CNN with half of the channels of every layer pruned gradually, then cut out.

The schedule is the default config's (dense for 500 steps, the cubic schedule
to the target by step 2000, then fine-tuning), but what it removes is whole
coupled channels: 50% of the filters of each conv and of the hidden dense
layer, with everything that reads them. At the end the job writes the smaller
model as `pruned_model.bin` and reports its FLOPs, CPU speedup and accuracy.

    jaxprune-train --config configs/digits_cnn_channels.py
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the channel-pruning CNN config."""
  config = train.get_config()
  config.name = 'digits_cnn_channels'
  config.model.name = 'cnn'
  config.model.features = (16, 32)
  config.model.dense = 64
  # target_sparsity is the share of each group's channels removed: 16 -> 8,
  # 32 -> 16, 64 -> 32 (multiples of round_to=8 all along the schedule).
  config.pruning = train.pruning_config(config.pruning, target_sparsity=0.5)
  config.channels.enabled = True
  return config
