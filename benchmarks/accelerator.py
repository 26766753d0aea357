"""The transform where users train: one GPU or TPU, side by side with a sort and plain Adam.

Three tables, each row timed interleaved with its baseline in one process (medians):

1. One tensor at s = 0.9 (ms): a max pass, the histogram and exact rules
   (`jaxprune.update_mask`, with the backend's search plan and with the other
   one), `jnp.sort` and `lax.top_k` of |w|.
2. The optimizer step on a GPT-2-small-shaped tree (124M float32 params, 148
   leaves, 50 pruned; `benchmarks/scale.py`'s tree, and with `--stacked` its
   stacked form), Adam, one donated jitted call per step: each row's step
   without and with a mask update vs plain Adam, the mask update (update step
   minus non-update step, ms), the compile wall time, and the conditionals and
   while loops in the compiled update step (each one a wait for the device on
   a GPU).
3. A full training step of a Flax GPT-2-small (12 x 768, bf16 compute, float32
   params, `jax.nn.dot_product_attention`), batch 8 x 512 tokens, forward +
   backward + Adam: non-update and update steps vs Adam, the amortised cost at
   TF's default `pruning_frequency=10`, and compile time vs Adam's (Adam is
   compiled twice and the second time counts: the first warms autotuning).

Rows: `jaxprune.pruned(adam, hp)` (the form the README teaches), the chained
form `optax.chain(adam, jaxprune.pruning(hp))`, the chained form with
`mask_source=params`, `pruned` with the exact rule, and a sort-based pruner
(`benchmarks/_baselines.sort_pruning`, jaxpruner's way). The goals of the
accelerator issue are printed at the end, each met or not.

Run: python benchmarks/accelerator.py [--tables 1,2,3] [--stacked] [--small]
(`--small` shrinks every size, to check on a CPU that the script runs.)
"""

from __future__ import annotations

import argparse
import re
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxprune

try:
  from benchmarks._baselines import per_call, sort_pruning, train_step
  from benchmarks._timing import interleaved, table
  from benchmarks.scale import gpt2_params
except ImportError:  # run as a script from the benchmarks folder
  from _baselines import per_call, sort_pruning, train_step
  from _timing import interleaved, table
  from scale import gpt2_params

HPARAMS = 'target_sparsity=0.9,sparsity_function_end_step=1'
ROWS = {  # name: (form, extra hparams)
  'pruned': ('pruned', ''),
  'chained': ('chain', ''),
  'chained params': ('chain', 'mask_source=params'),
  'pruned exact': ('pruned', 'threshold_method=exact'),
}
TAUGHT = 'pruned'  # the README's form
GOALS = {
  'mask update histogram ms': 1.0,
  'mask update exact ms': 1.5,
  'non-update optimizer step': 1.05,
  'non-update full step': 1.02,
  'compile optimizer step': 2.0,
  'compile full step': 1.2,
  'control flow': 4,
}


def optimizer(row: str, update: bool, layers: str = '') -> optax.GradientTransformation:
  """The row's optimizer, updating masks at every step after the first (or never)."""
  if row == 'Adam':
    return optax.adam(1e-4)
  if row == 'sort-based':
    return optax.chain(optax.adam(1e-4), sort_pruning(1 if update else 10**9, 0.9))
  form, extra = ROWS[row]
  timing = 'pruning_frequency=1' if update else 'begin_pruning_step=1000000000'
  hparams = jaxprune.parse_hparams(','.join(filter(None, [HPARAMS, timing, extra, layers])))
  if form == 'pruned':
    return jaxprune.pruned(optax.adam(1e-4), hparams)
  return optax.chain(optax.adam(1e-4), jaxprune.pruning(hparams))


def control_flow(compiled) -> int:
  """Conditionals and while loops in a compiled program."""
  return len(re.findall(r' (?:conditional|while)\(', compiled.as_text()))


def one_tensor(shapes) -> list[list[str]]:
  """Table 1: ms per call of each rule on one tensor, and of a sort and top_k."""
  rows = []
  for shape in shapes:
    w = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    kept = max(round(w.size * 0.1), 1)
    fns = _tensor_rules(w.size, kept)
    seconds = interleaved({k: (lambda f=f, w=w: f(w)) for k, f in fns.items()}, rounds=15)
    rows.append([' x '.join(map(str, shape))] + [f'{seconds[k] * 1e3:.2f}' for k in fns])
    print(f'one tensor {shape}: done', flush=True)
  return [
    [
      'tensor',
      'max pass',
      'histogram (fixed)',
      'histogram (adaptive)',
      'exact (fixed)',
      'exact (adaptive)',
      '`jnp.sort`',
      '`lax.top_k`',
    ]
  ] + rows


def _tensor_rules(size: int, kept: int) -> dict:
  """Table 1's candidates: jitted functions of one tensor."""
  return {
    'max pass': jax.jit(lambda w: jnp.max(jnp.abs(w))),
    'histogram fixed': jax.jit(lambda w: jaxprune.update_mask(w, 0.0, 0.9, mask_search='fixed')),
    'histogram adaptive': jax.jit(
      lambda w: jaxprune.update_mask(w, 0.0, 0.9, mask_search='adaptive')
    ),
    'exact fixed': jax.jit(
      lambda w: jaxprune.update_mask(w, 0.0, 0.9, threshold_method='exact', mask_search='fixed')
    ),
    'exact adaptive': jax.jit(
      lambda w: jaxprune.update_mask(w, 0.0, 0.9, threshold_method='exact', mask_search='adaptive')
    ),
    'jnp.sort': jax.jit(lambda w: jnp.abs(w) >= jnp.sort(jnp.abs(w).ravel())[size - kept]),
    'lax.top_k': jax.jit(lambda w: jnp.abs(w) >= jax.lax.top_k(jnp.abs(w).ravel(), kept)[0][-1]),
  }


def _compiled(tx, params, batch, loss_fn=None, update=False):
  """(donated step, state ready for a timed call, wall seconds to compile, control flow)."""
  step = train_step(tx, loss_fn)
  state = tx.init(params)
  if update:  # the state after step 0, so that the timed calls update masks
    state = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), state, params)[1]
  start = time.perf_counter()
  compiled = step.lower(params, state, batch).compile()
  return step, state, time.perf_counter() - start, control_flow(compiled)


def measure(rows, params, batch, loss_fn=None, layers='') -> dict[str, dict[str, float]]:
  """Per row: non-update and update step seconds vs Adam's, compile seconds, control flow."""
  figures = {}
  for row in rows:
    runs, compile_s = {}, {}
    adam = optax.adam(1e-4)
    if loss_fn is not None:  # warm the autotuning caches: Adam's second compile counts
      _compiled(adam, params, batch, loss_fn)
    step, state, compile_s['Adam'], _ = _compiled(adam, params, batch, loss_fn)
    runs['Adam'] = per_call(step, params, state, batch, 1)
    flow = 0
    for update in (False, True):
      tx = optimizer(row, update, layers)
      step, state, seconds, count = _compiled(tx, params, batch, loss_fn, update)
      if not update:
        compile_s[row] = seconds
      else:
        flow = count
      runs[f'{row} {"update" if update else "none"}'] = per_call(step, params, state, batch, 1)
    seconds = interleaved(runs, rounds=15)
    figures[row] = {
      'adam': seconds['Adam'],
      'none': seconds[f'{row} none'],
      'update': seconds[f'{row} update'],
      'compile': compile_s[row],
      'adam compile': compile_s['Adam'],
      'control flow': flow,
    }
    print(f'{row}: done (Adam {seconds["Adam"] * 1e3:.2f} ms)', flush=True)
  return figures


def optimizer_table(figures) -> list[list[str]]:
  rows = [
    [
      'row',
      'non-update',
      'update step',
      'mask update ms',
      'compile s (vs Adam)',
      'conditionals + loops',
    ]
  ]
  for row, f in figures.items():
    rows.append(
      [
        row,
        f'{f["none"] / f["adam"]:.2f}x',
        f'{f["update"] / f["adam"]:.2f}x',
        f'{(f["update"] - f["none"]) * 1e3:.2f}',
        f'{f["compile"]:.1f} ({f["compile"] / f["adam compile"]:.1f}x)',
        str(f['control flow']),
      ]
    )
  adam = next(iter(figures.values()))
  rows.append(['plain Adam', '1.00x', '', '', f'{adam["adam compile"]:.1f}', ''])
  return rows


def full_step_table(figures) -> list[list[str]]:
  rows = [['row', 'non-update', 'update', 'frequency 10, amortised', 'compile (vs Adam)']]
  for row, f in figures.items():
    amortised = (f['update'] + 9 * f['none']) / 10 / f['adam']
    rows.append(
      [
        row,
        f'{f["none"] / f["adam"]:.3f}x',
        f'{f["update"] / f["adam"]:.3f}x',
        f'{amortised:.3f}x',
        f'{f["compile"] / f["adam compile"]:.2f}x',
      ]
    )
  return rows


class _Block(nn.Module):
  width: int
  heads: int

  @nn.compact
  def __call__(self, x):
    b, t, _ = x.shape
    h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
    qkv = nn.Dense(3 * self.width, dtype=jnp.bfloat16, name='c_attn')(h)
    q, k, v = jnp.split(qkv.reshape(b, t, 3 * self.heads, -1), 3, axis=2)
    h = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, self.width)
    x = x + nn.Dense(self.width, dtype=jnp.bfloat16, name='c_proj')(h)
    h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
    h = nn.gelu(nn.Dense(4 * self.width, dtype=jnp.bfloat16, name='c_fc')(h))
    return x + nn.Dense(self.width, dtype=jnp.bfloat16, name='mlp_proj')(h)


class GPT2(nn.Module):
  """GPT-2 small's shapes (tied embedding), bf16 compute over float32 params."""

  layers: int = 12
  width: int = 768
  vocab: int = 50257

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(self.vocab, self.width, dtype=jnp.bfloat16, name='wte')
    x = embed(tokens) + nn.Embed(1024, self.width, dtype=jnp.bfloat16, name='wpe')(
      jnp.arange(tokens.shape[1])
    )
    for i in range(self.layers):
      x = _Block(self.width, max(self.width // 64, 1), name=f'h_{i}')(x)
    return embed.attend(nn.LayerNorm(dtype=jnp.bfloat16)(x)).astype(jnp.float32)


def full_step_model(layers, width, vocab, batch, length):
  model = GPT2(layers, width, vocab)
  tokens = jax.random.randint(jax.random.key(0), (batch, length), 0, vocab)
  params = model.init(jax.random.key(1), tokens[:1])['params']

  def loss_fn(params, tokens):
    logits = model.apply({'params': params}, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

  return params, loss_fn, (tokens,)


def _split(rows):
  """(header, body) of a table's rows."""
  return rows[0], rows[1:]


def _verdict(name, value, unit='x'):
  limit = GOALS[name]
  met = 'met' if value <= limit else 'NOT met'
  return f'{name} {value:.3g}{unit} ({met}, goal <= {limit}{unit})'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tables', default='1,2,3')
  parser.add_argument('--stacked', action='store_true', help='also the stacked GPT-2 tree')
  parser.add_argument('--small', action='store_true', help='tiny sizes (a CPU smoke run)')
  args = parser.parse_args()
  tables = args.tables.split(',')
  print(
    f'jax {jax.__version__} on {jax.devices()[0].device_kind} '
    f'({jax.default_backend()}); search plan of mask_search=auto: '
    f'{"adaptive" if jax.default_backend() == "cpu" else "fixed"}',
    flush=True,
  )
  goals = []
  if '1' in tables:
    shapes = [(256, 256), (512, 384)] if args.small else [(4096, 4096), (8192, 8192), (50257, 768)]
    print(table(*_split(one_tensor(shapes))), flush=True)
  if '2' in tables:
    trees = [False, True] if args.stacked else [False]
    for stacked in trees:
      params = gpt2_params(stacked)
      if args.small:
        params = jax.tree.map(lambda x: x[..., :64, :64] if x.ndim >= 2 else x[..., :64], params)
      grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
      layers = 'layer_axes_map=[h/:1]' if stacked else ''
      figures = measure(list(ROWS) + ['sort-based'], params, grads, layers=layers)
      print(
        f'Optimizer step, GPT-2-small-shaped tree ({"stacked" if stacked else "unstacked"}'
        f', {sum(x.size for x in jax.tree.leaves(params)) / 1e6:.0f}M params):'
      )
      print(table(*_split(optimizer_table(figures))), flush=True)
      for row in ROWS:
        f = figures[row]
        rule = 'exact' if 'exact' in row else 'histogram'
        tree = 'stacked' if stacked else 'tree'
        goals.append(
          f'{tree}, {row}: '
          + '; '.join(
            [
              _verdict(f'mask update {rule} ms', (f['update'] - f['none']) * 1e3, ' ms'),
              _verdict('control flow', f['control flow'], ''),
              _verdict('compile optimizer step', f['compile'] / f['adam compile']),
            ]
            + (
              [_verdict('non-update optimizer step', f['none'] / f['adam'])]
              if row == TAUGHT
              else []
            )
          )
        )
  if '3' in tables:
    sizes = (2, 64, 512, 2, 64) if args.small else (12, 768, 50257, 8, 512)
    params, loss_fn, batch = full_step_model(*sizes)
    figures = measure(['pruned', 'chained', 'chained params', 'sort-based'], params, batch, loss_fn)
    print(
      f'Full training step, Flax GPT-2 ({sizes[0]} x {sizes[1]}), batch {sizes[3]} x {sizes[4]}:'
    )
    print(table(*_split(full_step_table(figures))), flush=True)
    f = figures[TAUGHT]
    goals.append(
      f'full step, {TAUGHT}: '
      + '; '.join(
        [
          _verdict('non-update full step', f['none'] / f['adam']),
          _verdict('compile full step', f['compile'] / f['adam compile']),
        ]
      )
    )
  print('\n'.join(f'goals, {g}' for g in goals))


if __name__ == '__main__':
  main()
