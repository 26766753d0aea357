"""Gradual channel pruning: whole coupled channels masked on the transform's schedule,
then cut out of the model.

    graph = jaxprune.structured.trace(model.apply, variables, x)
    rule = jaxprune.channels.ChannelRule(graph)
    tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams, mask_rule=rule))
    ...  # train as usual
    result = jaxprune.channels.shrink(rule, variables, opt_state, x)
"""

from jaxprune._attributes import suggesting_getattr
from jaxprune.channels._finish import (
  Shrunk,
  channel_masks,
  masked_outputs,
  masked_variables,
  plan,
  shrink,
)
from jaxprune.channels._rule import ChannelRule, leaf_masks

__all__ = [
  'ChannelRule',
  'Shrunk',
  'channel_masks',
  'leaf_masks',
  'masked_outputs',
  'masked_variables',
  'plan',
  'shrink',
]

# A misspelt name suggests the nearest public one (`sparse.set` -> `sparse.set_`).
__getattr__ = suggesting_getattr(__name__, __all__)
