"""The main job's inputs that only fail once the model exists: each is a one-line ConfigError."""

import pytest
import train_faults

from jaxprune.train import defaults, loop
from jaxprune.train.errors import ConfigError


@pytest.mark.parametrize('hparams, message', [
    ({'nm_sparsity': '3:7'},
     "N:M 3:7: leaf 'Dense_0/kernel' with shape (64, 32): axis 0 has 64 entries, which is not "
     'divisible by M=7'),
    ({'layer_axes_map': ('Dense_0:2',)},
     "layer_axes_map: leaf 'Dense_0/kernel' of shape (64, 32) has no axes left after its 2 "
     'layer axes'),
    ({'weight_sparsity_map': ('Dense_0:0.5', 'Dense_0/kernel:0.6')},
     "weight_sparsity_map: leaf 'Dense_0/kernel' matches several entries"),
])
def test_hparams_that_do_not_fit_the_model_are_config_errors(tmp_path, hparams, message):
  config = train_faults.tiny_config(5)
  config.pruning = defaults.pruning_config(config.pruning, **hparams)
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError) as err:
    loop.train(config, str(workdir))
  assert str(err.value).startswith(message) and '\n' not in str(err.value)
  assert not workdir.exists()
