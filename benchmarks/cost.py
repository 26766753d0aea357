"""What pruning costs in a training step: jaxprune against plain Adam, every goal side by side.

One run measures the goals of the transform's cost on the installed jaxprune
and marks each `met` or `not met (by how much)`:

  1. temp     XLA's temporary buffers (`compile().memory_analysis()`) of the
              donated optimizer step (`tx.update`, then `optax.apply_updates`,
              gradients given), beyond plain Adam's, as a multiple of the params'
              bytes: goal <= 0.1x. A GPT-2-small-shaped float32 tree (148 leaves at
              12 layers) built from `jax.ShapeDtypeStruct`s, so nothing is allocated.
              Headline rows: both forms (`jaxprune.pruned(adam, hp)` and
              `optax.chain(adam, jaxprune.pruning(hp))`) x both search plans, the
              histogram rule, at 12 and 48 layers, and `pruned` with
              `mask_source='params'` (the search reads the params, not the updated
              weights) on the fixed plan. The rest of the matrix (forms x
              plans x the exact, blocked, global and N:M rules) at a reduced size
              (`--matrix-layers`, `--matrix-vocab`), since every row is a compile.
              Also the masks' and thresholds' state bytes per pruned weight.
  2. per step The loop users write (one jitted donated call per step: grad, update,
              apply_updates) on a 4-layer 1024-wide Flax MLP at batch 256 and on a
              small Flax transformer, steps without a mask update timed interleaved
              with plain Adam: goal <= 1.03x. HLO counts of those compiled steps.
              Steps with a mask update (every step) vs Adam, beside a sort-based
              pruner's (no goal: their cost).
  3. compile  CPU seconds to lower and compile the optimizer step vs Adam's at 12
              and 48 layers: goal <= 3x, and the ratio not growing from 12 to 48;
              a full GPT-2-small training step (transformers' FlaxGPT2LMHeadModel,
              shapes only, batch 1 x 64) vs Adam's: goal <= 1.2x, and its temp
              beyond Adam's (goal 1 in the step users compile).
  4. plans    `jaxprune.update_mask` on a 4096x4096 float32 array with each search
              plan, interleaved: one plan is the goal unless the second is >= 10%
              faster on the backend that chooses it (here the CPU, which chooses
              'adaptive').

Run: python benchmarks/cost.py [--quick] [--layers 12,48] [--matrix-layers 2] [--parts ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import math
import os
import re
import sys
import time
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxprune

try:
  from benchmarks._baselines import per_call, sort_pruning, train_step
  from benchmarks._cost_report import (
    COMPILE_REPEATS,
    EVERY,
    FORMS,
    HEADLINE,
    HLO_OPS,
    NEVER,
    PARAMS_SOURCE,
    PLANS,
    RULES,
    report,
  )
  from benchmarks._timing import interleaved
except ImportError:  # run as a script from the benchmarks folder
  from _baselines import per_call, sort_pruning, train_step
  from _cost_report import (
    COMPILE_REPEATS,
    EVERY,
    FORMS,
    HEADLINE,
    HLO_OPS,
    NEVER,
    PARAMS_SOURCE,
    PLANS,
    RULES,
    report,
  )
  from _timing import interleaved

BASE = 'target_sparsity=0.9,sparsity_function_end_step=1'
PARTS = ('temp', 'steps', 'compile', 'full', 'plans')


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Every size the run uses; `--quick` shrinks them all."""

  layers: tuple[int, ...] = (12, 48)
  width: int = 768
  vocab: int = 50257
  positions: int = 1024
  matrix_layers: int = 2
  matrix_vocab: int = 8192
  # The histogram rule's rows are the headline rows (at full size); the matrix adds the others.
  matrix_rules: tuple[str, ...] = ('exact', 'blocked', 'global', 'N:M 2:4')
  mlp_width: int = 1024
  mlp_depth: int = 4
  mlp_batch: int = 256
  lm_layers: int = 2
  lm_width: int = 256
  lm_heads: int = 4
  lm_length: int = 64
  lm_batch: int = 16
  lm_vocab: int = 256
  steps_per_call: int = 10
  rounds: int = 6  # a full turn of the six step candidates
  full_layers: int = 12
  full_width: int = 768
  full_vocab: int = 50257
  full_length: int = 64
  mask_side: int = 4096
  mask_rounds: int = 7


QUICK = Sizes(
  layers=(1, 2),
  width=64,
  vocab=512,
  positions=64,
  matrix_layers=1,
  matrix_vocab=512,
  mlp_width=64,
  mlp_depth=2,
  mlp_batch=16,
  lm_layers=1,
  lm_width=32,
  lm_heads=2,
  lm_length=8,
  lm_batch=2,
  lm_vocab=32,
  steps_per_call=2,
  rounds=2,
  full_layers=1,
  full_width=64,
  full_vocab=512,
  full_length=8,
  mask_side=256,
  mask_rounds=2,
)


# ---------------------------------------------------------------------------- optimizers


def optimizer(form: str, plan: str = 'auto', extra: str = '') -> optax.GradientTransformation:
  """Plain Adam ('Adam'), `jaxprune.pruned(adam, hp)` (also with PARAMS_SOURCE) or
  `optax.chain(adam, pruning(hp))`."""
  if form == PARAMS_SOURCE:
    form, extra = 'pruned', ','.join(filter(None, ['mask_source=params', extra]))
  if form == 'Adam':
    return optax.adam(1e-3)
  if form == 'sort-based':
    return optax.chain(optax.adam(1e-3), sort_pruning(1, 0.9))
  hparams = jaxprune.parse_hparams(','.join(filter(None, [BASE, f'mask_search={plan}', extra])))
  if form == 'pruned':
    return jaxprune.pruned(optax.adam(1e-3), hparams)
  return optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams))


def tree_bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def compile_seconds(fn, *args):
  """(CPU seconds to lower and compile `fn` (a jitted function) at `args`, the compiled step)."""
  start = time.process_time()
  compiled = fn.lower(*args).compile()
  return time.process_time() - start, compiled


def hlo_counts(compiled) -> dict[str, int]:
  text = compiled.as_text()
  return {op: len(re.findall(rf' {op}\(', text)) for op in HLO_OPS}


# ------------------------------------------------------------------- 1 and 3: the optimizer step


def gpt2_shapes(layers: int, width: int, vocab: int, positions: int) -> dict:
  """GPT-2-small-shaped float32 params as ShapeDtypeStructs (148 leaves at 12 layers)."""
  hidden = 4 * width
  layer = {
    'ln_1': {'scale': (width,), 'bias': (width,)},
    'attn': {
      'c_attn': {'kernel': (width, 3 * width), 'bias': (3 * width,)},
      'c_proj': {'kernel': (width, width), 'bias': (width,)},
    },
    'ln_2': {'scale': (width,), 'bias': (width,)},
    'mlp': {
      'c_fc': {'kernel': (width, hidden), 'bias': (hidden,)},
      'c_proj': {'kernel': (hidden, width), 'bias': (width,)},
    },
  }
  shapes = {
    'wte': {'embedding': (vocab, width)},
    'wpe': {'embedding': (positions, width)},
    'h': {str(i): layer for i in range(layers)},
    'ln_f': {'scale': (width,), 'bias': (width,)},
  }
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes, is_leaf=lambda x: isinstance(x, tuple)
  )


def optimizer_step(make_tx, params, repeats: int = 1) -> tuple[float, int, object, int]:
  """(compile CPU seconds, the least of `repeats` compiles of a new `make_tx()`, temp bytes,
  state shapes, fused kernels) of the donated optimizer step."""
  seconds = math.inf
  for _ in range(repeats):
    tx = make_tx()
    state = jax.eval_shape(tx.init, params)
    once, compiled = compile_seconds(train_step(tx), params, state, params)
    seconds = min(seconds, once)
  kernels = hlo_counts(compiled)['fusion']
  return seconds, compiled.memory_analysis().temp_size_in_bytes, state, kernels


def state_bytes(state, adam_state) -> tuple[int, int]:
  """(mask bytes, all other bytes beyond Adam's state: thresholds and counters)."""
  masks = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state) if x.dtype == jnp.bool_)
  return masks, tree_bytes(state) - tree_bytes(adam_state) - masks


def headline(sizes: Sizes, log) -> dict:
  """Temp, compile seconds and state of Adam and each HEADLINE row, per layer count."""
  out = {}
  for layers in sizes.layers:
    params = gpt2_shapes(layers, sizes.width, sizes.vocab, sizes.positions)
    adam = optimizer_step(functools.partial(optimizer, 'Adam'), params, COMPILE_REPEATS)
    adam_state = adam[2]
    row = {'Adam': (adam[0], adam[1], adam[3]), 'nbytes': tree_bytes(params)}
    row['leaves'] = len(jax.tree.leaves(params))
    for form, plan in HEADLINE:
      seconds, temp, state, kernels = optimizer_step(
        functools.partial(optimizer, form, plan), params, COMPILE_REPEATS
      )
      row[form, plan] = (seconds, temp, kernels)
      row['state'] = state_bytes(state, adam_state)
      log(f'  {layers} layers, {form} {plan}: {seconds:.1f} s, temp {temp / row["nbytes"]:.2f}x')
    out[layers] = row
  return out


def matrix(sizes: Sizes, log) -> dict:
  """Temp beyond Adam's (x params) of every form x plan x rule at the reduced size."""
  params = gpt2_shapes(sizes.matrix_layers, sizes.width, sizes.matrix_vocab, sizes.positions)
  nbytes = tree_bytes(params)
  _, adam_temp, _, _ = optimizer_step(functools.partial(optimizer, 'Adam'), params)
  out = {}
  for rule in sizes.matrix_rules:
    extra = RULES[rule]
    for form in FORMS:
      for plan in PLANS:
        make_tx = functools.partial(optimizer, form, plan, extra)
        seconds, temp, _, _ = optimizer_step(make_tx, params)
        out[rule, form, plan] = (temp - adam_temp) / nbytes
        log(f'  matrix {rule}, {form} {plan}: {seconds:.1f} s, temp {out[rule, form, plan]:.2f}x')
  return out


# ---------------------------------------------------------------------------- 2: steps


class MLP(nn.Module):
  width: int
  depth: int

  @nn.compact
  def __call__(self, x):
    for _ in range(self.depth):
      x = nn.relu(nn.Dense(self.width)(x))
    return nn.Dense(10)(x)


class Block(nn.Module):
  width: int
  heads: int

  @nn.compact
  def __call__(self, x):
    causal = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
    x = x + nn.SelfAttention(num_heads=self.heads)(nn.LayerNorm()(x), mask=causal)
    h = nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x)))
    return x + nn.Dense(self.width)(h)


class TinyLM(nn.Module):
  """A small pre-norm decoder: token and position embeddings, blocks, a tied-free head."""

  vocab: int
  width: int
  layers: int
  heads: int

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab, self.width)(tokens)
    x = x + nn.Embed(tokens.shape[1], self.width)(jnp.arange(tokens.shape[1]))
    for _ in range(self.layers):
      x = Block(self.width, self.heads)(x)
    return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def models(sizes: Sizes) -> dict:
  """name: (params, loss_fn, batch) of the MLP and the small transformer."""
  rng = np.random.default_rng(0)
  mlp = MLP(sizes.mlp_width, sizes.mlp_depth)
  x = jnp.asarray(rng.standard_normal((sizes.mlp_batch, sizes.mlp_width), np.float32))
  y = jnp.asarray(rng.integers(0, 10, sizes.mlp_batch))

  def mlp_loss(params, x, y):
    logits = mlp.apply({'params': params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  lm = TinyLM(sizes.lm_vocab, sizes.lm_width, sizes.lm_layers, sizes.lm_heads)
  tokens = jnp.asarray(rng.integers(0, sizes.lm_vocab, (sizes.lm_batch, sizes.lm_length)))

  def lm_loss(params, tokens):
    logits = lm.apply({'params': params}, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

  return {
    f'MLP {sizes.mlp_depth}x{sizes.mlp_width}, batch {sizes.mlp_batch}': (
      mlp.init(jax.random.key(0), x)['params'],
      mlp_loss,
      (x, y),
    ),
    f'transformer {sizes.lm_layers}x{sizes.lm_width}, {sizes.lm_heads} heads, '
    f'{sizes.lm_batch}x{sizes.lm_length}': (
      lm.init(jax.random.key(0), tokens)['params'],
      lm_loss,
      (tokens,),
    ),
  }


def steps(sizes: Sizes, log) -> dict:
  """Per model: interleaved ms per step and HLO counts of the non-update steps."""
  out = {}
  for model, (params, loss_fn, batch) in models(sizes).items():
    candidates = {
      'Adam': optimizer('Adam'),
      'pruned': optimizer('pruned', extra=NEVER),
      'chained': optimizer('chained', extra=NEVER),
      'pruned, update': optimizer('pruned', extra=EVERY),
      'chained, update': optimizer('chained', extra=EVERY),
      'sort-based, update': optimizer('sort-based'),
    }
    runs, counts = {}, {}
    for name, tx in candidates.items():
      state = tx.init(params)
      _, compiled = compile_seconds(train_step(tx, loss_fn), params, state, batch)
      if not name.endswith('update'):
        counts[name] = hlo_counts(compiled)
      calls = 1 if name.endswith('update') else sizes.steps_per_call
      runs[name] = (per_call(compiled, params, state, batch, calls), calls)
    seconds = interleaved({k: v[0] for k, v in runs.items()}, rounds=sizes.rounds)
    per_step = {k: seconds[k] / runs[k][1] for k in runs}
    out[model] = {'per_step': per_step, 'counts': counts}
    log(f'  {model}: Adam {per_step["Adam"] * 1e3:.1f} ms per step')
  return out


# ---------------------------------------------------------------------------- 3: a full GPT-2 step


def full_step(sizes: Sizes, plans: tuple[str, ...], log) -> dict:
  """CPU seconds to compile a full FlaxGPT2LMHeadModel training step, per row."""
  from transformers import FlaxGPT2LMHeadModel, GPT2Config

  config = GPT2Config(
    n_layer=sizes.full_layers,
    n_embd=sizes.full_width,
    n_head=max(sizes.full_width // 64, 1),
    vocab_size=sizes.full_vocab,
    n_positions=1024,
  )
  model = FlaxGPT2LMHeadModel(config, seed=0, _do_init=False)
  tokens = jax.ShapeDtypeStruct((1, sizes.full_length), jnp.int32)

  def apply(params, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return model.module.apply(
      {'params': params}, tokens, jnp.ones_like(tokens), positions, deterministic=True
    ).logits

  def loss_fn(params, tokens):
    logits = apply(params, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

  def init(tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return model.module.init(
      jax.random.key(0), tokens, jnp.ones_like(tokens), positions, deterministic=True
    )['params']

  params = jax.eval_shape(init, tokens)
  rows = [('Adam', 'auto')] + [(form, plan) for form in (*FORMS, PARAMS_SOURCE) for plan in plans]
  out = {'params': sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)), 'rows': {}}
  out['nbytes'] = tree_bytes(params)
  for form, plan in rows:
    seconds = math.inf
    for _ in range(COMPILE_REPEATS):
      tx = optimizer(form, plan, NEVER)
      state = jax.eval_shape(tx.init, params)
      once, compiled = compile_seconds(train_step(tx, loss_fn), params, state, (tokens,))
      seconds = min(seconds, once)
    out['rows'][form, plan] = (seconds, compiled.memory_analysis().temp_size_in_bytes)
    log(f'  full step {form} {plan}: {seconds:.1f} s')
  return out


# ---------------------------------------------------------------------------- 4: the plans


def plans(sizes: Sizes, log) -> dict:
  """Median seconds of jaxprune.update_mask per (rule, plan), interleaved."""
  side = sizes.mask_side
  w = jnp.asarray(np.random.default_rng(side).standard_normal((side, side), np.float32))
  fns = {}
  for method in ('histogram', 'exact'):
    for plan in PLANS:
      fn = jax.jit(
        functools.partial(jaxprune.update_mask, threshold_method=method, mask_search=plan)
      )
      fns[method, plan] = functools.partial(fn, w, 0.0, 0.9)
  seconds = interleaved(fns, rounds=sizes.mask_rounds)
  log(
    f'  update_mask {side}x{side}: '
    + ', '.join(f'{k}: {v * 1e3:.0f} ms' for k, v in seconds.items())
  )
  return seconds


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='tiny sizes: a smoke run')
  parser.add_argument('--layers', help='layer counts of the headline rows, e.g. 12,48')
  parser.add_argument('--matrix-layers', type=int, help='layers of the every-rule matrix')
  parser.add_argument('--matrix-vocab', type=int, help='vocabulary of the every-rule matrix')
  parser.add_argument(
    '--matrix-rules', help=f'rules of the every-rule matrix, any of {",".join(RULES)}'
  )
  parser.add_argument('--full-layers', type=int, help='layers of the full GPT-2 step')
  parser.add_argument('--full-plans', default='adaptive', help='plans of the full-step rows')
  parser.add_argument('--parts', default=','.join(PARTS), help=f'any of {",".join(PARTS)}')
  args = parser.parse_args(argv)
  sizes = QUICK if args.quick else Sizes()
  changes = {
    'layers': tuple(int(n) for n in args.layers.split(',')) if args.layers else None,
    'matrix_layers': args.matrix_layers,
    'matrix_vocab': args.matrix_vocab,
    'matrix_rules': tuple(args.matrix_rules.split(',')) if args.matrix_rules else None,
    'full_layers': args.full_layers,
  }
  sizes = dataclasses.replace(sizes, **{k: v for k, v in changes.items() if v is not None})
  parts = tuple(args.parts.split(','))
  # The hparams are chosen for timing (never or always an update): the schedule's advice
  # about them is beside the point here.
  warnings.filterwarnings('ignore', message='jaxprune: ')
  started = time.time()

  def log(text):
    print(f'[{time.time() - started:5.0f} s]{text}', file=sys.stderr, flush=True)

  # The backend's start-up (the first compile of a process) is nobody's compile time.
  jax.jit(lambda x: x + 1).lower(jnp.float32(0)).compile()
  results = {}
  if 'temp' in parts or 'compile' in parts:
    results['headline'] = headline(sizes, log)
  if 'temp' in parts:
    results['matrix'] = matrix(sizes, log)
  if 'steps' in parts:
    results['steps'] = steps(sizes, log)
  if 'full' in parts:
    results['full'] = full_step(sizes, tuple(args.full_plans.split(',')), log)
  if 'plans' in parts:
    results['plans'] = plans(sizes, log)
  text = (
    f'{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()}-core '
    f'{jax.devices()[0].platform.upper()}, jax {jax.__version__}, load average '
    f'{os.getloadavg()[0]:.1f}{", --quick" if args.quick else ""}\n\n'
    + report(sizes, results)
    + f'\n\nRun time: {time.time() - started:.0f} s.'
  )
  print(text, flush=True)
  return text


if __name__ == '__main__':
  main()
