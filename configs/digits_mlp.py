"""LeNet-300-100 on digits, gradual magnitude pruning to 90% (the default run).

jaxprune-train --config configs/digits_mlp.py --workdir runs/digits
"""

import ml_collections

import jaxprune_train as train


def get_config() -> ml_collections.ConfigDict:
  """Returns the default config (`jaxprune-train --helpfull` describes each field)."""
  return train.get_config()
