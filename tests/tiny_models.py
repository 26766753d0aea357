"""Small models shared by the core's test files."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
  """Dense_0: (4, 8) kernel, Dense_1: (8, 3) kernel."""

  @nn.compact
  def __call__(self, x):
    hidden = nn.relu(nn.Dense(8)(x))  # made first, so named Dense_0
    return nn.Dense(3)(hidden)


def mlp_params():
  return MLP().init(jax.random.key(0), jnp.ones((1, 4)))['params']
