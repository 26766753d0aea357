"""What the benchmarks compare jaxprune with: a sort-based pruner, and the step users write."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def sort_pruning(frequency: int, sparsity: float) -> optax.GradientTransformation:
  """A minimal sort-based magnitude pruner (jaxpruner's and tfmot's way): the baseline.

  Masks kernels (ndim >= 2) every `frequency` steps from step `frequency` on, from
  a full sort of |params + updates|, and zeroes what they prune, like jaxprune.
  """

  def init_fn(params):
    return (
      jnp.zeros((), jnp.int32),
      jax.tree.map(lambda p: jnp.ones(p.shape, bool) if p.ndim >= 2 else None, params),
    )

  def mask_of(p):
    magnitudes = jnp.abs(p)
    kept = max(int(round(p.size * (1 - sparsity))), 1)
    threshold = jnp.sort(magnitudes.ravel())[p.size - kept]
    return magnitudes >= threshold

  def update_fn(updates, state, params):
    step, masks = state
    is_none = lambda x: x is None
    new = optax.apply_updates(params, updates)
    masks = jax.lax.cond(
      (step > 0) & (step % frequency == 0),
      lambda: jax.tree.map(
        lambda m, p: None if m is None else mask_of(p), masks, new, is_leaf=is_none
      ),
      lambda: masks,
    )
    out = jax.tree.map(
      lambda m, u, p: u if m is None else jnp.where(m, u, -p),
      masks,
      updates,
      params,
      is_leaf=is_none,
    )
    return out, (step + 1, masks)

  return optax.GradientTransformation(init_fn, update_fn)


def train_step(tx: optax.GradientTransformation, loss_fn=None):
  """The step users write, jitted once with params and optimizer state donated.

  With `loss_fn`, `step(params, state, batch)` differentiates it; without,
  `step(params, state, grads)` applies given gradients (the optimizer alone).
  """

  def step(params, opt_state, batch):
    grads = batch if loss_fn is None else jax.grad(loss_fn)(params, *batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return jax.jit(step, donate_argnums=(0, 1))


def per_call(step, params, state, batch, calls: int):
  """A callable that makes `calls` calls of the donated `step`, one per training step.

  It owns a copy of `params` and `state` and carries them on from call to call,
  so consecutive timings cover consecutive steps (and the mask updates in them).
  """
  holder = {'params': jax.tree.map(jnp.copy, params), 'state': jax.tree.map(jnp.copy, state)}

  def run():
    p, s = holder['params'], holder['state']
    for _ in range(calls):
      p, s = step(p, s, batch)
    holder['params'], holder['state'] = p, s
    return p

  return run
