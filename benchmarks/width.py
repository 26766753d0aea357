"""Transformer width: FLOPs kept and CPU speedup with and without pruning the
residual stream through norms (`trace(norms=...)`), and a small ViT trained on
scikit-learn's digits, pruned and fine-tuned.

Models: the HF Flax builders of `tests/thirdparty_zoo_hf.py` (random weights)
at benchmark sizes. Each model is pruned at `ratio=0.3`, L2 importance:

  heads + MLP       `trace(fn, ...)` as by default: heads, head_dim and MLP
                    units lose 30% each; the width cannot go.
  + width           `trace(fn, ..., norms='exact')`: the residual stream
                    loses 30% too (every group, the default kinds).
  like TP           ratio per kind as Torch-Pruning's examples prune:
                    width, MLP units and head_dim (ViT, `prune_head_dims`) or
                    whole heads (BERT, Llama, `prune_num_heads`) at 0.3.

FLOPs are counted by structured's one counter (`plan_flops`: every
dot_general and conv, a multiply-add is 2; attention's q.k and scores.v
included) and reported as `flops_kept`, a fraction of the dense model's.
Torch-Pruning's counter (`tp.utils.count_ops_and_params`) sees module calls
(Linear, conv, norms) and not the attention matmuls, so "weight FLOPs kept"
counts only products with a weight, like it (benchmarks/_flops.py: the same
count on the pruned callable's jaxpr, checked against `plan_flops`, leaving out
the products of two activations). The kept channel counts are not rounded
(round_to=1, Torch-Pruning's default) for the FLOPs columns; the timed models
and the last FLOPs column are at the default round_to=8. All candidates of a
model are timed interleaved in one run (benchmarks/_timing.py).

Digits: a ViT (hidden 64, 4 layers, 4 heads, 2x2 patches of the 8x8 images,
the gray channel repeated 3 times) trained 400 steps on 1437 of the 1797
images, pruned at 0.3 (+ width with L2 or activation importance, exact or
renormalised norms), then fine-tuned 150 steps at the pruned shapes; test
accuracy on the other 360 images.

Run: `python benchmarks/width.py` (`--quick`: fewer rounds and steps).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')
)

import thirdparty_zoo_hf as hf  # noqa: E402

import jaxprune.structured as jps  # noqa: E402

try:
  from benchmarks import _flops
  from benchmarks._timing import interleaved, table
except ImportError:  # run as a script from the benchmarks folder
  import _flops
  from _timing import interleaved, table

RATIO = 0.3
EXACT = jps.Constraint(round_to=1)

# name -> (builder at benchmark size, batch, Torch-Pruning's per-kind ratio, its number).
MODELS = {
  'HF ViT-S/8, 64x64': (
    functools.partial(hf.hf_vit, hidden=384, layers=6, heads=6, image=64, patch=8),
    8,
    {'width': RATIO, 'head_dim': RATIO, 'channels': RATIO},
    0.487,
  ),
  'HF BERT 4x512, 128 tokens': (
    functools.partial(hf.hf_bert, hidden=512, layers=4, heads=8, length=128),
    8,
    {'width': RATIO, 'heads': RATIO, 'channels': RATIO},
    0.484,
  ),
  'HF Llama 4x512 (8 heads, 4 kv), 128 tokens': (
    functools.partial(hf.hf_llama, hidden=512, layers=4, heads=8, kv_heads=4, length=128),
    4,
    {'width': RATIO, 'heads': RATIO, 'channels': RATIO},
    None,
  ),
}


def flops_kept(before: float, after: float) -> float:
  """FLOPs after a plan as a fraction of before (1.0 when there were none), as structured's
  results report them."""
  return after / before if before else 1.0


def weight_flops(graph, variables, plan, args) -> float:
  """The FLOPs of the model pruned by `plan` that multiply by a weight, as Torch-Pruning
  counts (benchmarks/_flops.py), once that counter's total is checked to be `plan_flops`."""
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  total, weights = _flops.count(pruned_fn, new_variables, *args)
  if total != jps.plan_flops(graph, plan):
    raise AssertionError(
      f'FLOPs counted {total}, but plan_flops gives {jps.plan_flops(graph, plan)}'
    )
  return weights


def _trace(case, args, norms):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    return jps.trace(case.fn, case.variables, *args, norms=norms)


def bench(name: str, rounds: int) -> list[list[str]]:
  """Rows for one model: FLOPs kept (round_to 1), time and speedup (round_to 8)."""
  build, batch, tp_ratio, tp = MODELS[name]
  case = build()
  args = case.inputs(batch)
  graphs = {'heads + MLP': _trace(case, args, None)}
  graphs['+ width'] = graphs['like TP'] = _trace(case, args, 'exact')
  ratios = {'heads + MLP': RATIO, '+ width': RATIO, 'like TP': tp_ratio}
  dense_plan = jps.make_plan(graphs['heads + MLP'], {})
  dense = graphs['heads + MLP'].total_flops
  candidates = {'dense': functools.partial(jax.jit(case.fn), case.variables, *args)}
  dense_weights = weight_flops(graphs['heads + MLP'], case.variables, dense_plan, args)
  flops, exact = {}, {}
  for label, graph in graphs.items():
    plan = jps.select(graph, case.variables, ratio=ratios[label], constraint=EXACT)
    flops[label] = flops_kept(dense, jps.plan_flops(graph, plan))
    flops[label, 'weights'] = flops_kept(
      dense_weights, weight_flops(graph, case.variables, plan, args)
    )
    exact[label] = not any(graph.groups[g].approximate for g in plan.removed)
    plan8 = jps.select(graph, case.variables, ratio=ratios[label])
    new_variables, pruned_fn = jps.apply_plan(graph, case.variables, plan8)
    candidates[label] = functools.partial(pruned_fn, new_variables, *args)
    flops[label, 8] = flops_kept(dense, jps.plan_flops(graph, plan8))
  seconds = interleaved(candidates, rounds)
  rows = []
  for label in graphs:
    tp_cell = f'{tp:.3f}' if tp is not None and label != 'heads + MLP' else '-'
    rows.append(
      [
        name,
        label,
        f'{flops[label]:.3f}',
        f'{flops[label, "weights"]:.3f}',
        tp_cell,
        'yes' if exact[label] else 'no',
        f'{flops[label, 8]:.3f}',
        f'{1e3 * seconds["dense"]:.1f}',
        f'{1e3 * seconds[label]:.1f}',
        f'{seconds["dense"] / seconds[label]:.2f}x',
      ]
    )
  return rows


def _digits():
  from sklearn.datasets import load_digits

  digits = load_digits()
  images = (digits.images / 16.0).astype(np.float32)
  x = np.repeat(images[:, None], 3, axis=1)  # NCHW, the gray channel three times
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(0).permutation(len(y))
  x, y = x[order], y[order]
  return (x[:1437], y[:1437]), (x[1437:], y[1437:])


def _train(fn, variables, train, steps, lr, batch=64, seed=0):
  """Adam on cross-entropy; returns the trained variables."""
  opt = optax.adam(lr)
  state = opt.init(variables)

  @jax.jit
  def step(variables, state, x, y):
    loss = lambda v: optax.softmax_cross_entropy_with_integer_labels(fn(v, x), y).mean()
    grads = jax.grad(loss)(variables)
    updates, state = opt.update(grads, state, variables)
    return optax.apply_updates(variables, updates), state

  rng = np.random.default_rng(seed)
  for _ in range(steps):
    pick = rng.choice(len(train[1]), batch, replace=False)
    variables, state = step(
      variables, state, jnp.asarray(train[0][pick]), jnp.asarray(train[1][pick])
    )
  return variables


def _accuracy(fn, variables, test):
  return float(np.mean(np.argmax(np.asarray(fn(variables, jnp.asarray(test[0]))), -1) == test[1]))


def digits(steps: int, tune_steps: int) -> list[list[str]]:
  """Rows: FLOPs kept and test accuracy before and after the recovery fine-tune."""
  train, test = _digits()
  case = hf.hf_vit(hidden=64, layers=4, heads=4, image=8, patch=2)
  fn = jax.jit(case.fn)
  variables = _train(fn, case.variables, train, steps, 1e-3)
  example = jnp.asarray(train[0][:64])
  calibration = [jnp.asarray(train[0][i : i + 64]) for i in range(0, 512, 64)]
  rows = [['dense', '1.000', f'{_accuracy(fn, variables, test):.3f}', '-']]
  runs = [
    ('heads + MLP', None, 'l2', EXACT),
    ('+ width, exact, L2', 'exact', 'l2', EXACT),
    ('+ width, exact, activations', 'exact', 'activation', EXACT),
    (
      '+ width, renormalised, activations',
      'renormalise',
      'activation',
      jps.Constraint(round_to=1, allow_approximate=True),
    ),
  ]
  for label, norms, importance, constraint in runs:
    graph = _trace(case, (example,), norms)
    if importance == 'activation':
      importance = jps.activation_importance(graph, variables, calibration)
    plan = jps.select(graph, variables, ratio=RATIO, importance=importance, constraint=constraint)
    kept = flops_kept(graph.total_flops, jps.plan_flops(graph, plan))
    new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
    before = _accuracy(pruned_fn, new_variables, test)
    tuned = _train(pruned_fn, new_variables, train, tune_steps, 3e-4, seed=1)
    rows.append([label, f'{kept:.3f}', f'{before:.3f}', f'{_accuracy(pruned_fn, tuned, test):.3f}'])
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='3 timing rounds, short training')
  parser.add_argument('--skip-digits', action='store_true', help='only the FLOPs and timing table')
  args = parser.parse_args()
  rounds = 3 if args.quick else 15
  print(
    f'jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; '
    f'ratio {RATIO} (L2, uniform); median of {rounds} interleaved calls'
  )
  header = [
    'model',
    'pruned',
    'FLOPs kept',
    'weight FLOPs kept',
    'Torch-Pruning',
    'exact',
    'FLOPs kept (round_to 8)',
    'ms dense',
    'ms pruned',
    'speedup',
  ]
  rows = []
  for name in MODELS:
    rows += bench(name, rounds)
    print(table(header, rows[-3:]), flush=True)
  print()
  print(table(header, rows))
  if not args.skip_digits:
    steps, tune = (100, 30) if args.quick else (400, 150)
    print()
    print(
      table(
        ['ViT on digits', 'FLOPs kept', 'test accuracy', 'after fine-tune'], digits(steps, tune)
      )
    )


if __name__ == '__main__':
  main()
