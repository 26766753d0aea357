"""A small byte-level transformer language model trained on Python's standard library.

The workload of the one-shot pruning benchmark: a pre-norm decoder (RMSNorm,
causal multi-head attention, SwiGLU MLP; Shazeer 2020, arXiv 2002.05202) that
reads bytes, trained on the `.py` files of the interpreter's own standard
library (`sysconfig.get_paths()['stdlib']`), text that ships on every machine.
Files are split into train and held-out sets by a hash of their path, so no
held-out file is ever seen in training. The files are nearly all ASCII, so
bits per byte is bits per character.

    python -m benchmarks.charlm --steps 600 --out /tmp/charlm.msgpack
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sysconfig
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Config:
  """Model, data and optimiser settings of the byte-level LM."""

  layers: int = 4
  width: int = 128
  heads: int = 4
  hidden: int = 384
  seq_len: int = 128
  batch_size: int = 16
  steps: int = 900
  learning_rate: float = 3e-3
  warmup: int = 30
  heldout_every: int = 10  # one file in this many goes to the held-out set
  seed: int = 0
  scan: bool = False  # the blocks under one `nn.scan`, their params stacked ('blocks')


class Block(nn.Module):
  """Pre-norm transformer block: causal attention, then a SwiGLU MLP."""

  width: int
  heads: int
  hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    b, t, d = x.shape
    hd = d // self.heads
    h = nn.RMSNorm(name='attn_norm')(x)
    q, k, v = (
      nn.Dense(d, use_bias=False, name=n)(h).reshape(b, t, self.heads, hd) for n in ('q', 'k', 'v')
    )
    logits = jnp.einsum('bthd,bshd->bhts', q, k) / np.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    attended = jnp.einsum('bhts,bshd->bthd', weights, v).reshape(b, t, d)
    x = x + nn.Dense(d, use_bias=False, name='o')(attended)
    h = nn.RMSNorm(name='mlp_norm')(x)
    gate = nn.Dense(self.hidden, use_bias=False, name='gate')(h)
    up = nn.Dense(self.hidden, use_bias=False, name='up')(h)
    return x + nn.Dense(d, use_bias=False, name='down')(nn.silu(gate) * up)


class _ScanStep(Block):
  """A block as `nn.scan` runs it: (carry, x) -> (carry, y)."""

  def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
    return Block.__call__(self, x), None


class CharLM(nn.Module):
  """Byte-level decoder: embedding + learned positions, blocks, norm, output head.

  With `config.scan` the blocks run under one `nn.scan` (as MaxText and other large
  JAX models run theirs), their params stacked along a leading axis under 'blocks'
  (`stack_blocks` turns the unrolled params into these): the same function.
  """

  config: Config

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    c = self.config
    x = nn.Embed(256, c.width, name='embed')(tokens)
    pos = self.param('pos', nn.initializers.normal(0.02), (c.seq_len, c.width))
    x = x + pos[: tokens.shape[1]]
    if c.scan:
      blocks = nn.scan(
        _ScanStep, variable_axes={'params': 0}, split_rngs={'params': True}, length=c.layers
      )
      x, _ = blocks(c.width, c.heads, c.hidden, name='blocks')(x, None)
    else:
      for i in range(c.layers):
        x = Block(c.width, c.heads, c.hidden, name=f'block_{i}')(x)
    return nn.Dense(256, use_bias=False, name='head')(nn.RMSNorm(name='final_norm')(x))


def stack_blocks(params: PyTree, layers: int) -> PyTree:
  """The params of the unrolled model as the scanned one (`Config.scan`) holds them: the
  blocks' leaves stacked along a new leading axis under 'blocks'."""
  blocks = [params[f'block_{i}'] for i in range(layers)]
  rest = {k: v for k, v in params.items() if not k.startswith('block_')}
  return {**rest, 'blocks': jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)}


def stdlib_files() -> list[str]:
  """The `.py` files of the standard library, sorted, without site-packages."""
  root = sysconfig.get_paths()['stdlib']
  found = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in ('site-packages', '__pycache__'))
    found += [os.path.join(folder, f) for f in sorted(files) if f.endswith('.py')]
  return found


def load_split(heldout_every: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """(train bytes, held-out bytes) as uint8 arrays, split by file (a hash of its path)."""
  root = sysconfig.get_paths()['stdlib']
  parts: dict[bool, list[bytes]] = {False: [], True: []}
  for path in stdlib_files():
    digest = hashlib.sha256(os.path.relpath(path, root).encode()).digest()
    with open(path, 'rb') as f:
      parts[digest[0] % heldout_every == 0].append(f.read())
  if not parts[True] or not parts[False]:
    raise ValueError(f'stdlib at {root}: found no .py files for one of the two splits')
  return tuple(np.frombuffer(b'\n'.join(parts[h]), np.uint8) for h in (False, True))


def sample_batches(
  data: np.ndarray, batch_size: int, seq_len: int, count: int, seed: int
) -> list[np.ndarray]:
  """`count` int32 batches `(batch_size, seq_len + 1)` of random windows of `data`."""
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, len(data) - seq_len - 1, (count, batch_size))
  return [np.stack([data[s : s + seq_len + 1] for s in row]).astype(np.int32) for row in starts]


def heldout_batches(
  data: np.ndarray, batch_size: int, seq_len: int, count: int
) -> list[np.ndarray]:
  """Evenly spaced, non-overlapping windows of the held-out bytes (deterministic)."""
  total = batch_size * count
  stride = (len(data) - seq_len - 1) // total
  starts = np.arange(total) * stride
  windows = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)
  return list(windows.reshape(count, batch_size, seq_len + 1))


def apply_fn(config: Config) -> Callable[[PyTree, jax.Array], jax.Array]:
  """`fn(params, tokens) -> logits`, the model's apply for `jaxprune.oneshot.prune`."""
  model = CharLM(config)
  return lambda params, tokens: model.apply({'params': params}, tokens)


def bits_per_char(config: Config, params: PyTree, batches: list[np.ndarray]) -> float:
  """Mean next-byte cross-entropy in bits over `batches` of `(batch, seq_len + 1)`."""
  fn = apply_fn(config)

  @jax.jit
  def nats(p, batch):
    logits = fn(p, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

  return float(np.mean([nats(params, b) for b in batches]) / np.log(2))


def init_params(config: Config) -> PyTree:
  tokens = jnp.zeros((1, config.seq_len), jnp.int32)
  return CharLM(config).init(jax.random.key(config.seed), tokens)['params']


def train(
  config: Config,
  train_data: np.ndarray,
  *,
  extra: optax.GradientTransformation | None = None,
  log: Callable[[str], None] = print,
) -> tuple[PyTree, Any]:
  """Trains from scratch with AdamW (warmup, cosine decay); `extra` is chained after
  the optimiser (e.g. `jaxprune.pruning(hp)`). Returns (params, optimiser state)."""
  fn = apply_fn(config)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, config.learning_rate, config.warmup, config.steps, config.learning_rate / 10
  )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
  if extra is not None:
    tx = optax.chain(tx, extra)
  params = init_params(config)
  state = tx.init(params)

  @jax.jit
  def step(params, state, batch):
    def loss(p):
      logits = fn(p, batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

  start = time.time()
  for i, batch in enumerate(
    sample_batches(train_data, config.batch_size, config.seq_len, config.steps, config.seed)
  ):
    params, state, value = step(params, state, batch)
    if i % 50 == 0 or i == config.steps - 1:
      log(f'step {i}: loss {float(value) / np.log(2):.3f} bits/char, {time.time() - start:.0f}s')
  return params, state


def save(path: str, config: Config, params: PyTree) -> None:
  blob = {
    'config': json.dumps(dataclasses.asdict(config)),
    'params': flax.serialization.to_state_dict(jax.device_get(params)),
  }
  with open(path, 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(blob))


def load(path: str) -> tuple[Config, PyTree]:
  with open(path, 'rb') as f:
    blob = flax.serialization.msgpack_restore(f.read())
  config = Config(**json.loads(blob['config']))
  return config, jax.tree.map(jnp.asarray, blob['params'])


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out', required=True, help='checkpoint path (msgpack)')
  for field in dataclasses.fields(Config):
    parser.add_argument(f'--{field.name}', type=type(field.default), default=field.default)
  args = parser.parse_args(argv)
  config = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
  train_data, heldout = load_split(config.heldout_every)
  print(f'train {len(train_data) / 1e6:.1f} MB, held-out {len(heldout) / 1e6:.1f} MB')
  params, _ = train(config, train_data)
  bpc = bits_per_char(config, params, heldout_batches(heldout, 32, config.seq_len, 8))
  print(f'held-out {bpc:.3f} bits/char')
  save(args.out, config, params)


if __name__ == '__main__':
  main()
