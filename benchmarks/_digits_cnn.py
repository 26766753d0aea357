"""The digits CNN task of benchmarks/sparse_training.py, importable without jaxprune's package.

jaxpruner's comparison row runs in another virtual environment (jaxpruner
needs an older JAX than jaxprune), so this file holds copies of the main job's
digits split and CNN (`jaxprune_train.load_digits`, `jaxprune_train.CNN`, which
benchmarks/sparse_training.py checks them against) and the training loop both
sides share.
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

STEPS, BATCH, LR = 1500, 64, 3e-3
END_STEP, UPDATE_FREQ, DROP_FRACTION = int(0.75 * STEPS), 50, 0.3
SEEDS, SPARSITIES = (0, 1, 2), (0.8, 0.9)
TIMED_STEPS, ROUNDS = 50, 25


class Digits(NamedTuple):
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


def load_digits() -> Digits:
  """scikit-learn's 1,797 digits as `jaxprune_train.load_digits()` splits them: images
  (8, 8, 1) scaled to [0, 1], 449 held out by the permutation of seed 0."""
  from sklearn.datasets import load_digits as sk_load_digits

  digits = sk_load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  labels = digits.target.astype(np.int32)
  order = np.random.default_rng(0).permutation(len(labels))
  test, train = order[:449], order[449:]
  return Digits(images[train], labels[train], images[test], labels[test])


class CNN(nn.Module):
  """`jaxprune_train.CNN()`: 3x3 convs of 16 and 32 channels, each with 2x2 max pooling,
  then a 64-wide dense layer and 10 logits."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for channels in (16, 32):
      x = nn.relu(nn.Conv(channels, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2), padding='SAME')
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(64)(x))
    return nn.Dense(10)(x)


def task(seed: int):
  """(model, initial params, dataset, batch indices (STEPS, BATCH)) for one seed."""
  dataset = load_digits()
  model = CNN()
  dummy = jnp.zeros((1, *dataset.x_train.shape[1:]), jnp.float32)
  params = jax.jit(model.init)(jax.random.PRNGKey(seed), dummy)['params']  # as the job draws
  rng = np.random.default_rng(seed)
  epochs = -(-STEPS * BATCH // len(dataset.y_train))
  order = np.concatenate([rng.permutation(len(dataset.y_train)) for _ in range(epochs)])
  return model, params, dataset, order[: STEPS * BATCH].reshape(STEPS, BATCH)


def make_step(model, tx, post=None):
  """A jitted training step (params, opt_state, x, y) -> (params, opt_state)."""

  def loss(params, x, y):
    logits = model.apply({'params': params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(params, opt_state, x, y):
    grads = jax.grad(loss)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return (params if post is None else post(params, opt_state)), opt_state

  return jax.jit(step, donate_argnums=(0, 1))


def train(model, tx, params, dataset, batches, post=None):
  """Trains for STEPS steps; (test accuracy, final params, final opt_state)."""
  step = make_step(model, tx, post)
  opt_state = tx.init(params)
  params = jax.tree.map(lambda p: p.copy(), params)
  for idx in batches:
    params, opt_state = step(params, opt_state, dataset.x_train[idx], dataset.y_train[idx])
  logits = model.apply({'params': params}, dataset.x_test)
  return float(np.mean(np.argmax(logits, -1) == dataset.y_test)), params, opt_state


def step_times(model, txs: dict, params, dataset, batches, posts: dict | None = None) -> dict:
  """Median seconds per step of each transform, TIMED_STEPS consecutive steps per turn.

  The candidates take turns (interleaved), each continuing its own run from
  step 0, so every turn of SET/RigL/GMP holds one mask update (every
  UPDATE_FREQ = TIMED_STEPS steps) and load drift hits them alike.
  """
  posts = posts or {}
  runs = {}
  for name, tx in txs.items():
    step = make_step(model, tx, posts.get(name))
    runs[name] = [step, jax.tree.map(lambda p: p.copy(), params), tx.init(params)]
  times = {name: [] for name in txs}
  for r in range(ROUNDS + 1):
    for name, run in runs.items():
      start = time.perf_counter()
      for i in range(TIMED_STEPS):
        idx = batches[r * TIMED_STEPS + i]
        run[1], run[2] = run[0](run[1], run[2], dataset.x_train[idx], dataset.y_train[idx])
      jax.block_until_ready(run[1])
      if r:  # the first turn compiles
        times[name].append((time.perf_counter() - start) / TIMED_STEPS)
  return {name: statistics.median(ts) for name, ts in times.items()}
