"""Flax Linen models for the main job: a LeNet-300-100 style MLP and a small CNN."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections


class MLP(nn.Module):
  """A multilayer perceptron, LeNet-300-100 by default.

  Attributes:
    features: widths of the hidden layers.
    num_classes: number of output logits.
  """

  features: Sequence[int] = (300, 100)
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps inputs (batch, ...) to logits (batch, num_classes)."""
    x = x.reshape((x.shape[0], -1))
    for width in self.features:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
  """A small convolutional network: 3x3 convs with 2x2 max pooling, then dense.

  Attributes:
    features: output channels of each conv layer.
    dense: width of the hidden dense layer.
    num_classes: number of output logits.
  """

  features: Sequence[int] = (16, 32)
  dense: int = 64
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps images (batch, height, width[, channels]) to logits."""
    if x.ndim == 3:
      x = x[..., None]
    for channels in self.features:
      x = nn.relu(nn.Conv(channels, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2), padding='SAME')
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense)(x))
    return nn.Dense(self.num_classes)(x)


def create_model(config: ml_collections.ConfigDict, num_classes: int) -> nn.Module:
  """Builds the model named by `config.name` ('mlp', 'cnn' or 'lm').

  Args:
    config: the `model` block of a training config.
    num_classes: number of output logits.

  Returns:
    The Flax module.
  """
  if config.name == 'mlp':
    return MLP(features=tuple(config.features), num_classes=num_classes)
  if config.name == 'cnn':
    return CNN(features=tuple(config.features), dense=config.dense, num_classes=num_classes)
  if config.name == 'lm':
    from jaxprune_train._lm import DecoderLM, check_shape

    check_shape(config)
    return DecoderLM(
      num_layers=config.num_layers,
      d_model=config.d_model,
      num_heads=config.num_heads,
      num_kv_heads=config.num_kv_heads,
      mlp_dim=config.mlp_dim,
      compute_dtype=config.compute_dtype,
    )
  raise ValueError(f"model.name={config.name!r}: unknown model; use 'mlp', 'cnn' or 'lm'.")


def init_params(model: nn.Module, input_shape: Sequence[int], seed: int) -> dict:
  """Initialises the model's params for inputs of shape (batch, *input_shape).

  Raises:
    ValueError: a CNN given inputs that are not images.
  """
  if isinstance(model, CNN) and len(input_shape) not in (2, 3):
    raise ValueError(
      f"model.name='cnn' takes images of shape (height, width) or (height, width, "
      f'channels), but the inputs have shape {tuple(input_shape)}; reshape x_train and '
      "x_test to images (e.g. x.reshape(len(x), 8, 8, 1)), or use model.name='mlp'."
    )
  dummy = jnp.zeros((1, *input_shape), jnp.float32)
  # Jitted: one compilation instead of one per initialiser op (a second of every run's
  # start), and the same values bit for bit.
  return jax.jit(model.init)(jax.random.PRNGKey(seed), dummy)['params']
