"""The train state, the optimizer chain and the jitted-once train/eval steps.

`train_step(state, batch)` is a pure function of its arguments: the pruning
state travels inside `state.opt_state`, so jitting it once (in `loop.py`) gives
a step that never recompiles and that can be sharded like any optax update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import jaxprune

PyTree = Any
Batch = tuple[jax.Array, jax.Array]


class TrainState(NamedTuple):
  """Everything a training run carries from step to step.

  Attributes:
    step: int32 scalar, the number of train steps taken.
    params: the model's params (pruned entries are exactly zero).
    opt_state: the optax state; with pruning it holds a `jaxprune.PruningState`.
  """

  step: jax.Array
  params: PyTree
  opt_state: optax.OptState


def make_optimizer(
  config: ml_collections.ConfigDict, mask_rule: jaxprune.MaskRule | None = None
) -> optax.GradientTransformation:
  """Builds `jaxprune.pruned(optimizer, config.pruning)`.

  The same masks and params as `optax.chain(optimizer, jaxprune.pruning(...))`,
  and the same state, at a lower cost per step.

  Args:
    config: a training config; uses `optimizer.{name, learning_rate, momentum,
      weight_decay}`, `prune` and `pruning`.
    mask_rule: the pruning transform's mask rule (channel pruning), if any.

  Returns:
    The optimizer, followed by the pruning transform when `config.prune`.
  """
  opt = config.optimizer
  if opt.name == 'adam':
    base = optax.adam(opt.learning_rate)
  elif opt.name == 'adamw':
    base = optax.adamw(opt.learning_rate, weight_decay=opt.weight_decay)
  elif opt.name == 'sgd':
    base = optax.sgd(opt.learning_rate, momentum=opt.momentum or None)
  else:
    raise ValueError(
      f"optimizer.name={opt.name!r}: unknown optimizer; use 'adam', 'adamw' or 'sgd'."
    )
  if not config.prune:
    return base
  return jaxprune.pruned(base, config.pruning, mask_rule=mask_rule)


def create_train_state(params: PyTree, tx: optax.GradientTransformation) -> TrainState:
  """The state at step 0 for `params` and optimizer `tx`."""
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def _loss_and_logits(
  apply_fn: Callable, params: PyTree, x: jax.Array, y: jax.Array
) -> tuple[jax.Array, jax.Array]:
  logits = apply_fn({'params': params}, x)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return loss, logits


def make_train_step(
  apply_fn: Callable, tx: optax.GradientTransformation
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """Returns `train_step(state, batch) -> (state, {'loss', 'accuracy'})`.

  Args:
    apply_fn: the Flax module's `apply`.
    tx: the optimizer chain; its update is given the params, which the
      pruning transform needs.

  Returns:
    A pure function, meant to be jitted once by the caller.
  """

  def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
    x, y = batch
    grad_fn = jax.value_and_grad(lambda p: _loss_and_logits(apply_fn, p, x, y), has_aux=True)
    (loss, logits), grads = grad_fn(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == y)
    return TrainState(state.step + 1, params, opt_state), {'loss': loss, 'accuracy': accuracy}

  return train_step


def make_evaluate(
  apply_fn: Callable, batch_size: int = 1024
) -> Callable[[PyTree, np.ndarray, np.ndarray], dict[str, float]]:
  """Returns `evaluate(params, x, y) -> {'loss', 'accuracy'}` over a whole split.

  The loss and accuracy are means over every label: one per example, or one per
  position for a language model's (n, seq_len) labels.

  Args:
    apply_fn: the Flax module's `apply`.
    batch_size: examples per forward pass (bounds memory on large splits); a
      language model's chunks hold 16 times as many labels.

  Returns:
    A host function that runs a jitted forward pass per chunk and averages.
  """

  @jax.jit
  def sums(params: PyTree, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = apply_fn({'params': params}, x)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return losses.sum(), jnp.sum(jnp.argmax(logits, -1) == y)

  def evaluate(params: PyTree, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    # A language model has a label per position: its chunks hold as many labels as
    # `batch_size` examples of one label each (the mean is over labels either way).
    per_example = max(1, y[0].size if len(y) else 1)
    rows = batch_size if per_example == 1 else max(1, batch_size * 16 // per_example)
    loss, correct = 0.0, 0
    for start in range(0, len(y), rows):
      chunk = slice(start, start + rows)
      chunk_loss, chunk_correct = sums(params, x[chunk], y[chunk])
      loss += float(chunk_loss)
      correct += int(chunk_correct)
    return {'loss': loss / y.size, 'accuracy': correct / y.size}

  return evaluate
