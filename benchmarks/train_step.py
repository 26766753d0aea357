"""Training-step overhead of jaxprune.pruning vs plain optax (and vs a sort-based pruner).

A 4-layer 1024-wide Flax MLP, batch 256, Adam. Times, interleaved and median:
  * plain          optax.adam alone;
  * non-update     chained with jaxprune.pruning on steps without a mask update;
  * freq 10 / 100  a run of 100 steps with a mask update every 10 / 100 steps
                   (amortised per step), histogram thresholds;
  * sort freq 10   the same run with masks from a full sort of each kernel, the
                   way sort-based pruners (jaxpruner, tfmot) compute them.

Run: python benchmarks/train_step.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxprune

try:
  from benchmarks._timing import interleaved, table
except ImportError:  # run as a script from the benchmarks folder
  from _timing import interleaved, table

WIDTH, DEPTH, BATCH, RUN = 1024, 4, 256, 100


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    for _ in range(DEPTH):
      x = nn.relu(nn.Dense(WIDTH)(x))
    return nn.Dense(10)(x)


def sort_pruning(frequency: int, sparsity: float) -> optax.GradientTransformation:
  """A minimal sort-based magnitude pruner: the baseline, not part of jaxprune."""

  def init_fn(params):
    return (jnp.zeros((), jnp.int32),
            jax.tree.map(lambda p: jnp.ones(p.shape, bool) if p.ndim >= 2 else None, params))

  def mask_of(p):
    magnitudes = jnp.abs(p)
    kept = max(int(round(p.size * (1 - sparsity))), 1)
    threshold = jnp.sort(magnitudes.ravel())[p.size - kept]
    return magnitudes >= threshold

  def update_fn(updates, state, params):
    step, masks = state
    new = optax.apply_updates(params, updates)
    masks = jax.lax.cond(
        step % frequency == 0,
        lambda: jax.tree.map(lambda m, p: None if m is None else mask_of(p), masks, new,
                             is_leaf=lambda x: x is None),
        lambda: masks)
    out = jax.tree.map(lambda m, u, p: u if m is None else jnp.where(m, u, -p),
                       masks, updates, params, is_leaf=lambda x: x is None)
    return out, (step + 1, masks)

  return optax.GradientTransformation(init_fn, update_fn)


def make_run(tx, params, x, y, steps):
  model = MLP()

  def loss_fn(params):
    logits = model.apply({'params': params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def run(params, opt_state):
    def step(carry, _):
      params, opt_state = carry
      grads = jax.grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), None
    (params, opt_state), _ = jax.lax.scan(step, (params, opt_state), None, length=steps)
    return params

  opt_state = tx.init(params)
  return lambda: run(params, opt_state)


def main() -> None:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((BATCH, WIDTH), np.float32))
  y = jnp.asarray(rng.integers(0, 10, BATCH))
  params = MLP().init(jax.random.key(0), x)['params']

  def pruned(text):
    return optax.chain(optax.adam(1e-3), jaxprune.pruning(jaxprune.parse_hparams(text)))

  never = f'begin_pruning_step={10 * RUN},target_sparsity=0.9'
  every = 'target_sparsity=0.9,sparsity_function_end_step=100,pruning_frequency={}'
  runs = {
      'plain': optax.adam(1e-3),
      'non-update': pruned(never),
      'freq 10': pruned(every.format(10)),
      'freq 100': pruned(every.format(100)),
      'sort freq 10': optax.chain(optax.adam(1e-3), sort_pruning(10, 0.9)),
  }
  # pruning_frequency=10 updates at steps 10, 20, ...: 9 of 100 steps in a run.
  seconds = interleaved({name: make_run(tx, params, x, y, RUN) for name, tx in runs.items()},
                        rounds=5)
  base = seconds['plain']
  rows = [[name, f'{seconds[name] / RUN * 1e3:.2f}', f'{seconds[name] / base:.3f}x']
          for name in runs]
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}: {DEPTH}x{WIDTH} MLP, '
        f'batch {BATCH}, Adam, {RUN}-step runs')
  print(table(['step', 'ms / step', 'vs plain optax'], rows))


if __name__ == '__main__':
  main()
