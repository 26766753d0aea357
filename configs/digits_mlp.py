"""LeNet-300-100 on digits, gradual magnitude pruning to 90% (the default run).

    jaxprune-train --config configs/digits_mlp.py --workdir runs/digits
"""

import ml_collections

from jaxprune.train import defaults


def get_config() -> ml_collections.ConfigDict:
  """Returns the default config (see jaxprune/train/defaults.py for each field)."""
  return defaults.get_config()
