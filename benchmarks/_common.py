"""What the digits benchmarks do around `jaxprune_train`'s public parts: initialise a model
as the main job does, and measure test accuracy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def init_params(model: nn.Module, input_shape: Sequence[int], seed: int) -> Any:
  """The params of `model` for inputs of shape (batch, *input_shape), drawn as the main job
  draws a run's (`model.init` with `PRNGKey(seed)` on one example of zeros, jitted)."""
  dummy = jnp.zeros((1, *input_shape), jnp.float32)
  return jax.jit(model.init)(jax.random.PRNGKey(seed), dummy)['params']


def test_accuracy(
  apply_fn: Callable, params: Any, x: np.ndarray, y: np.ndarray, batch_size: int = 1024
) -> float:
  """The fraction of `x` that `apply_fn({'params': params}, x)` labels `y`, a jitted forward
  pass per `batch_size` examples."""

  @jax.jit
  def correct(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(jnp.argmax(apply_fn({'params': params}, x), -1) == y)

  right = sum(
    int(correct(params, x[start : start + batch_size], y[start : start + batch_size]))
    for start in range(0, len(y), batch_size)
  )
  return right / len(y)
