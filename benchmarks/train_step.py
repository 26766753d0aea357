"""Training-step overhead of jaxprune.pruning vs plain optax (and vs a sort-based pruner).

A 4-layer 1024-wide Flax MLP, batch 256, Adam. Every candidate runs the same
100 consecutive training steps (steps 1 to 100), timed interleaved, median of 5:
  * plain             optax.adam alone;
  * non-update        chained with jaxprune.pruning, masks never updated (the
                      `lax.cond` is there, its update branch never runs);
  * freq 10 / 100     a mask update every 10 / 100 steps: the 100 steps hold 10 / 1
                      updates (at steps 10, 20, ... / at step 100), histogram rule;
  * ... pruned        the same with `jaxprune.pruned(adam, hp)`, the wrapping form
                      (the same masks as the chained form);
  * ... params        the chained form with `mask_source='params'` (masks from the params
                      the step starts from instead of params + updates);
  * sort freq 10      masks from a full sort of each kernel every 10 steps, the way
                      sort-based pruners (jaxpruner, tfmot) compute them.

Two loops: the one most scripts write (one jitted call per step, params and
optimizer state donated), and all 100 steps inside one jitted `lax.scan`.

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
  from benchmarks._baselines import per_call, sort_pruning, train_step
  from benchmarks._timing import interleaved, table
except ImportError:  # run as a script from the benchmarks folder
  from _baselines import per_call, sort_pruning, train_step
  from _timing import interleaved, table

WIDTH, DEPTH, BATCH, RUN = 1024, 4, 256, 100


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(DEPTH):
      x = nn.relu(nn.Dense(WIDTH)(x))
    return nn.Dense(10)(x)


def loss_fn(params, x, y):
  logits = MLP().apply({'params': params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def optimizers() -> dict[str, optax.GradientTransformation]:
  def chained(text):
    return optax.chain(optax.adam(1e-3), jaxprune.pruning(jaxprune.parse_hparams(text)))

  def wrapped(text):
    return jaxprune.pruned(optax.adam(1e-3), jaxprune.parse_hparams(text))

  never = f'begin_pruning_step={100 * RUN},target_sparsity=0.9'
  every = 'target_sparsity=0.9,sparsity_function_end_step=1000,pruning_frequency={}'
  return {
    'plain': optax.adam(1e-3),
    'non-update': chained(never),
    'freq 10': chained(every.format(10)),
    'freq 100': chained(every.format(100)),
    'non-update pruned': wrapped(never),
    'freq 10 pruned': wrapped(every.format(10)),
    'freq 100 pruned': wrapped(every.format(100)),
    'non-update params': chained(never + ',mask_source=params'),
    'freq 10 params': chained(every.format(10) + ',mask_source=params'),
    'sort freq 10': optax.chain(optax.adam(1e-3), sort_pruning(10, 0.9)),
  }


def at_step_one(tx, params, batch):
  """Params and optimizer state after step 0, so that timed runs cover steps 1, 2, ..."""
  state = tx.init(params)
  return train_step(tx, loss_fn)(jax.tree.map(jnp.copy, params), state, batch)


def scanned(tx, params, state, batch):
  """A callable running RUN steps in one jitted lax.scan, carried on from call to call."""

  @jax.jit
  def run(params, state):
    def body(carry, _):
      params, state = carry
      grads = jax.grad(loss_fn)(params, *batch)
      updates, state = tx.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    return jax.lax.scan(body, (params, state), None, length=RUN)[0]

  holder = [(params, state)]

  def call():
    holder[0] = run(*holder[0])
    return holder[0][0]

  return call


def main() -> None:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((BATCH, WIDTH), np.float32))
  y = jnp.asarray(rng.integers(0, 10, BATCH))
  params = MLP().init(jax.random.key(0), x)['params']
  txs = optimizers()
  print(
    f'jax {jax.__version__} on {jax.devices()[0].platform}: {DEPTH}x{WIDTH} MLP, '
    f'batch {BATCH}, Adam, {RUN} consecutive steps per timing'
  )
  header = ['step', 'ms / step', 'vs plain optax']
  for loop in ('one jitted call per step, donated', f'one jitted lax.scan of {RUN} steps'):
    runs = {}
    for name, tx in txs.items():
      start, state = at_step_one(tx, params, (x, y))
      runs[name] = (
        per_call(train_step(tx, loss_fn), start, state, (x, y), RUN)
        if loop.endswith('donated')
        else scanned(tx, start, state, (x, y))
      )
    seconds = interleaved(runs, rounds=5)
    base = seconds['plain']
    rows = [
      [name, f'{seconds[name] / RUN * 1e3:.2f}', f'{seconds[name] / base:.3f}x'] for name in runs
    ]
    print(f'\n{loop}:\n' + table(header, rows), flush=True)


if __name__ == '__main__':
  main()
