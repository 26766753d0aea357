"""Structured pruning benchmark: FLOPs, CPU speedup and accuracy, measured in one run.

1. A ResNet-18-style CNN (CIFAR layout: 3x3 stem, 4 stages of 2 basic blocks,
   64-128-256-512 channels) on 32x32 inputs, batch 64, with 50% of the
   channels of every group removed: FLOPs ratio and measured inference
   speedup of the jitted model (goal: >= 2.5x).
2. The small CNN of `jaxprune_train` on scikit-learn's digits (16-32 conv, 64
   dense, and the same at twice the width): trained 20 epochs, then 50% of
   its channels removed (L2, uniform) and fine-tuned 10 epochs (goal: test
   accuracy within 1 point of the unpruned model); for the default CNN also
   fine-tuned 20 epochs with label smoothing 0.1.

Run: `python benchmarks/structured.py` (add `--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxprune_train as train_lib
from jaxprune.structured import (
  apply_plan,
  check_linen_shapes,
  linen_feature_sizes,
  linen_resized,
  plan_flops,
  select,
  trace,
)


class BasicBlock(nn.Module):
  """A basic block; the shortcut is chosen by config, not by comparing shapes with
  `features` (which a pruned block no longer matches when run under `linen_resized`)."""

  features: int
  strides: int = 1
  project: bool = False

  @nn.compact
  def __call__(self, x):
    norm = lambda: nn.BatchNorm(use_running_average=True)
    y = nn.Conv(self.features, (3, 3), self.strides, use_bias=False)(x)
    y = nn.relu(norm()(y))
    y = norm()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
    if self.project:
      x = norm()(nn.Conv(self.features, (1, 1), self.strides, use_bias=False)(x))
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """ResNet-18 for 32x32 inputs (He et al. 2016, CIFAR variant)."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(64, (3, 3), use_bias=False)(x)))
    for stage, features in enumerate((64, 128, 256, 512)):
      for block in range(2):
        first = stage > 0 and block == 0
        x = BasicBlock(features, 2 if first else 1, project=first)(x)
    return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


def _seconds(fns, args, reps):
  """Median seconds per call of each `fn(*args)`, calls interleaved so load hits all alike."""
  for fn, a in zip(fns, args, strict=True):
    jax.block_until_ready(fn(*a))  # compile
  times = [[] for _ in fns]
  for _ in range(reps):
    for fn, a, t in zip(fns, args, times, strict=True):
      start = time.perf_counter()
      jax.block_until_ready(fn(*a))
      t.append(time.perf_counter() - start)
  return [float(np.median(t)) for t in times]


def resnet_speedup(batch: int, reps: int) -> dict:
  model = ResNet18()
  x = jax.random.normal(jax.random.key(1), (batch, 32, 32, 3))
  variables = model.init(jax.random.key(0), x[:1])
  graph = trace(model.apply, variables, x)
  plan = select(graph, variables, ratio=0.5)
  new_variables, pruned_fn = apply_plan(graph, variables, plan)
  dense_apply = jax.jit(model.apply)

  @jax.jit
  def pruned_apply(v, x):
    with linen_resized(v):
      return model.apply(v, x)

  dense_s, pruned_s, callable_s = _seconds(
    [dense_apply, pruned_apply, pruned_fn],
    [(variables, x), (new_variables, x), (new_variables, x)],
    reps,
  )
  flops = graph.total_flops, plan_flops(graph, plan)
  count = lambda tree: sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree['params']))
  return {
    'groups': len(graph.prunable_groups),
    'flops_ratio': flops[0] / flops[1],
    'params_ratio': count(variables) / count(new_variables),
    'dense_ms': 1e3 * dense_s,
    'pruned_ms': 1e3 * pruned_s,
    'callable_ms': 1e3 * callable_s,
    'speedup': dense_s / pruned_s,
    'callable_speedup': dense_s / callable_s,
  }


def _train(apply, params, dataset, epochs, lr, seed, label_smoothing=0.0):
  """Adam with a cosine decay to 0, batch 32; cross-entropy, labels optionally smoothed."""
  n = len(dataset.y_train)
  optimizer = optax.adam(optax.cosine_decay_schedule(lr, epochs * (n // 32)))
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, x, y):
    if label_smoothing:
      labels = optax.smooth_labels(jax.nn.one_hot(y, 10), label_smoothing)
      loss = lambda p: optax.softmax_cross_entropy(apply(p, x), labels).mean()
    else:
      loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean()
    grads = jax.grad(loss)(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for epoch in range(epochs):
    order = np.random.default_rng((seed, epoch)).permutation(n)
    for start in range(0, n - 31, 32):
      idx = order[start : start + 32]
      params, state = step(params, state, dataset.x_train[idx], dataset.y_train[idx])
  return params


def _accuracy(apply, params, dataset):
  logits = jax.jit(apply)(params, dataset.x_test)
  return 100.0 * float(np.mean(np.argmax(logits, -1) == dataset.y_test))


def digits_accuracy(
  features: tuple[int, int],
  dense: int,
  epochs: int,
  finetune_epochs: int,
  smooth_epochs: int | None = None,
) -> dict:
  dataset = train_lib.load_digits(seed=0)
  model = train_lib.CNN(features=features, dense=dense)
  params = model.init(jax.random.key(0), dataset.x_train[:1])['params']
  dense_apply = lambda p, x: model.apply({'params': p}, x)
  params = _train(dense_apply, params, dataset, epochs, 2e-3, seed=0)
  dense_acc = _accuracy(dense_apply, params, dataset)

  variables = {'params': params}
  graph = trace(model.apply, variables, dataset.x_train[:8])
  plan = select(graph, variables, ratio=0.5)
  new_variables, _ = apply_plan(graph, variables, plan)

  def pruned_apply(p, x):
    with linen_resized({'params': p}):
      return model.apply({'params': p}, x)

  pruned_acc = _accuracy(pruned_apply, new_variables['params'], dataset)
  tuned = _train(pruned_apply, new_variables['params'], dataset, finetune_epochs, 2e-3, seed=1)
  tuned_acc = _accuracy(pruned_apply, tuned, dataset)
  smooth_acc = None
  if smooth_epochs:  # The same fine-tuning, longer and with label smoothing 0.1.
    smooth = _train(
      pruned_apply,
      new_variables['params'],
      dataset,
      smooth_epochs,
      2e-3,
      seed=1,
      label_smoothing=0.1,
    )
    smooth_acc = _accuracy(pruned_apply, smooth, dataset)
  # The pruned architecture, rebuilt explicitly and trained from scratch for as long.
  sizes = linen_feature_sizes(new_variables)
  small = train_lib.CNN(features=(sizes['Conv_0'], sizes['Conv_1']), dense=sizes['Dense_0'])
  check_linen_shapes(small, new_variables, dataset.x_train[:1])
  small_apply = lambda p, x: small.apply({'params': p}, x)
  scratch = small.init(jax.random.key(0), dataset.x_train[:1])['params']
  scratch = _train(small_apply, scratch, dataset, epochs + finetune_epochs, 2e-3, seed=0)
  scratch_acc = _accuracy(small_apply, scratch, dataset)
  flops = graph.total_flops, plan_flops(graph, plan)
  return {
    'dense_acc': dense_acc,
    'pruned_acc': pruned_acc,
    'finetuned_acc': tuned_acc,
    'smooth_acc': smooth_acc,
    'smooth_epochs': smooth_epochs,
    'scratch_acc': scratch_acc,
    'scratch_epochs': epochs + finetune_epochs,
    'flops_ratio': flops[0] / flops[1],
    'plan': plan.summary().replace('\n', '; '),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='small smoke run')
  args = parser.parse_args()
  reps = 3 if args.quick else 10
  batch = 8 if args.quick else 64
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}, {jax.devices()[0].device_kind}')
  r = resnet_speedup(batch, reps)
  print(
    f'ResNet-18, 32x32, batch {batch}, 50% of channels removed uniformly '
    f'({r["groups"]} prunable groups)'
  )
  print(f'  FLOPs ratio {r["flops_ratio"]:.2f}x, params ratio {r["params_ratio"]:.2f}x')
  print(
    f'  dense {r["dense_ms"]:.1f} ms, pruned (Linen, resized) {r["pruned_ms"]:.1f} ms, '
    f'pruned callable {r["callable_ms"]:.1f} ms'
  )
  print(
    f'  speedup {r["speedup"]:.2f}x (goal >= 2.5x), pruned callable {r["callable_speedup"]:.2f}x'
  )
  epochs, finetune = (2, 1) if args.quick else (20, 10)
  rows = []
  smooth_epochs = 2 if args.quick else 20
  for features, dense in (((16, 32), 64), ((32, 64), 128)):
    default = features == (16, 32)
    d = digits_accuracy(features, dense, epochs, finetune, smooth_epochs if default else None)
    name = f'digits CNN {features[0]}-{features[1]} conv, {dense} dense'
    print(f'{name}, 50% of channels removed ({d["plan"]}), fine-tuned {finetune} epochs')
    print(
      f'  FLOPs ratio {d["flops_ratio"]:.2f}x; test accuracy dense {d["dense_acc"]:.2f}%, '
      f'pruned {d["pruned_acc"]:.2f}%, fine-tuned {d["finetuned_acc"]:.2f}% '
      f'(goal: within 1 point, gap {d["dense_acc"] - d["finetuned_acc"]:+.2f}); the pruned '
      f'architecture trained from scratch for {d["scratch_epochs"]} epochs: '
      f'{d["scratch_acc"]:.2f}%'
    )
    rows.append(
      f'| {name}, 50% channels + {finetune} epochs fine-tune: test accuracy | '
      f'{d["finetuned_acc"]:.2f}% vs {d["dense_acc"]:.2f}% dense '
      f'(FLOPs {d["flops_ratio"]:.2f}x fewer; from scratch {d["scratch_acc"]:.2f}%) | '
      'within 1 point |'
    )
    if d['smooth_acc'] is not None:
      print(
        f'  fine-tuned {d["smooth_epochs"]} epochs with label smoothing 0.1 instead: '
        f'{d["smooth_acc"]:.2f}% (gap {d["dense_acc"] - d["smooth_acc"]:+.2f})'
      )
      rows.append(
        f'| {name}, 50% channels + {d["smooth_epochs"]} epochs fine-tune with label '
        f'smoothing 0.1: test accuracy | {d["smooth_acc"]:.2f}% vs '
        f'{d["dense_acc"]:.2f}% dense | within 1 point |'
      )
  print('| benchmark | measured | goal |')
  print('|---|---|---|')
  print(f'| ResNet-18 32x32 b{batch}, 50% channels: FLOPs ratio | {r["flops_ratio"]:.2f}x | - |')
  print(
    f'| ResNet-18 32x32 b{batch}, 50% channels: CPU speedup | {r["speedup"]:.2f}x '
    f'(pruned callable {r["callable_speedup"]:.2f}x) | >= 2.5x |'
  )
  print('\n'.join(rows))


if __name__ == '__main__':
  main()
