"""ResNet-50 (He et al. 2016) in Flax: 53 convs, about 25.6M parameters, BatchNorm and
projection shortcuts. The structured tests check its groups and FLOPs against published
counts; benchmarks/trace.py times tracing it."""

import flax.linen as nn
import jax.numpy as jnp


class Bottleneck(nn.Module):
  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x, train: bool = False):
    norm = lambda: nn.BatchNorm(use_running_average=not train)
    y = nn.relu(norm()(nn.Conv(self.features, (1, 1), use_bias=False)(x)))
    y = nn.Conv(self.features, (3, 3), strides=self.strides, use_bias=False)(y)
    y = nn.relu(norm()(y))
    y = norm()(nn.Conv(4 * self.features, (1, 1), use_bias=False)(y))
    if x.shape[-1] != 4 * self.features or self.strides != 1:
      x = nn.Conv(4 * self.features, (1, 1), strides=self.strides, use_bias=False)(x)
      x = norm()(x)
    return nn.relu(x + y)


class ResNet50(nn.Module):
  num_classes: int = 1000

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(64, (7, 7), strides=2, use_bias=False)(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding='SAME')
    for stage, blocks in enumerate((3, 4, 6, 3)):
      for block in range(blocks):
        x = Bottleneck(64 * 2**stage, strides=2 if stage and not block else 1)(x, train)
    return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))
