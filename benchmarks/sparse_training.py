"""Sparse training on the digits CNN: dense, gradual magnitude pruning, static, SET and RigL.

scikit-learn's bundled digits (8x8), the CNN of `jaxprune-train` (two 3x3 convs
of 16 and 32 channels, a 64-wide dense layer), Adam 3e-3, batch 64, 1500
steps, the same batches for every method. At 80% and 90% sparsity of the four
kernels, 3 seeds each:
  * dense        optax.adam alone;
  * GMP          optax.chain(adam, jaxprune.pruning(hp)): Zhu & Gupta's schedule
                 from 0 to the target over steps 150-1125, masks every 50 steps,
                 uniform per layer (exact threshold);
  * static       jaxprune.sparse.static: random ERK masks, fixed;
  * SET          jaxprune.sparse.set_: ERK, every 50 steps to step 1125, drop
                 fraction 0.3 with cosine decay, random regrowth;
  * RigL         jaxprune.sparse.rigl: the same, regrowth by gradient magnitude;
  * jaxpruner    jaxpruner.RigL with the same knobs, in its own virtual environment
                 (/work/venv-jaxpruner, or JAXPRUNER_PYTHON), if it is there.
Step time: one jitted step per call, 50 consecutive steps per turn (one mask
update for GMP/SET/RigL), the candidates interleaved, median of 25 turns, at 90%.

Run: python benchmarks/sparse_training.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import jax
import numpy as np
import optax

import jaxprune
import jaxprune_train as train_lib
from jaxprune import sparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _digits_cnn as task_lib  # noqa: E402
from _timing import table  # noqa: E402

JAXPRUNER_PYTHON = os.environ.get('JAXPRUNER_PYTHON', '/work/venv-jaxpruner/bin/python')


def transforms(sparsity: float, seed: int) -> dict[str, optax.GradientTransformation]:
  adam = optax.adam(task_lib.LR)
  hp = jaxprune.get_pruning_hparams()
  hp.target_sparsity = sparsity
  hp.threshold_method = 'exact'
  hp.pruning_frequency = task_lib.UPDATE_FREQ
  hp.begin_pruning_step = hp.sparsity_function_begin_step = task_lib.STEPS // 10
  hp.end_pruning_step = hp.sparsity_function_end_step = task_lib.END_STEP
  dynamic = dict(
    end_step=task_lib.END_STEP,
    update_freq=task_lib.UPDATE_FREQ,
    drop_fraction=task_lib.DROP_FRACTION,
    distribution='erk',
    seed=seed,
  )
  return {
    'GMP': optax.chain(adam, jaxprune.pruning(hp)),
    'static': sparse.static(adam, sparsity, distribution='erk', seed=seed),
    'SET': sparse.set_(adam, sparsity, **dynamic),
    'RigL': sparse.rigl(adam, sparsity, **dynamic),
  }


def kernel_sparsity(params) -> float:
  kernels = [np.asarray(p) for n, p in jaxprune.named_leaves(params) if n.endswith('kernel')]
  return sum(int((k == 0).sum()) for k in kernels) / sum(k.size for k in kernels)


def check_the_copies() -> None:
  """_digits_cnn holds copies of `jaxprune_train`'s digits split and CNN (jaxpruner's
  environment cannot import jaxprune): they must give the same data, params and logits."""
  model, params, dataset, _ = task_lib.task(0)
  original = train_lib.load_digits()
  dummy = np.zeros((1, *original.x_train.shape[1:]), np.float32)
  original_params = jax.jit(train_lib.CNN().init)(jax.random.PRNGKey(0), dummy)['params']
  same = [
    all(np.array_equal(a, b) for a, b in zip(dataset, original[:4], strict=True)),
    jax.tree.structure(params) == jax.tree.structure(original_params),
    all(jax.tree.leaves(jax.tree.map(np.array_equal, params, original_params))),
    np.array_equal(
      model.apply({'params': params}, dataset.x_test),
      train_lib.CNN().apply({'params': params}, original.x_test),
    ),
  ]
  if not all(same):
    raise SystemExit(f'benchmarks/_digits_cnn.py no longer copies jaxprune_train: {same}')


def jaxpruner_row() -> dict:
  if not os.path.exists(JAXPRUNER_PYTHON):
    return {'error': f'no jaxpruner environment at {JAXPRUNER_PYTHON}'}
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_jaxpruner_rigl.py')
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  done = subprocess.run(
    [JAXPRUNER_PYTHON, script], capture_output=True, text=True, env=env, check=False
  )
  if done.returncode:
    return {'error': done.stderr.strip().splitlines()[-1]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def mean_std(values: list[float]) -> str:
  return f'{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}'


def main() -> None:
  accuracy: dict[tuple[str, float], list[float]] = {}
  reached: dict[tuple[str, float], list[float]] = {}
  check_the_copies()
  for seed in task_lib.SEEDS:
    model, params, dataset, batches = task_lib.task(seed)
    acc, _, _ = task_lib.train(model, optax.adam(task_lib.LR), params, dataset, batches)
    accuracy.setdefault(('dense', 0.0), []).append(acc)
    for sparsity in task_lib.SPARSITIES:
      for name, tx in transforms(sparsity, seed).items():
        acc, final, _ = task_lib.train(model, tx, params, dataset, batches)
        accuracy.setdefault((name, sparsity), []).append(acc)
        reached.setdefault((name, sparsity), []).append(kernel_sparsity(final))
    print(f'seed {seed} done', file=sys.stderr, flush=True)
  model, params, dataset, batches = task_lib.task(0)
  sparsity = task_lib.SPARSITIES[-1]
  times = task_lib.step_times(
    model, {'dense': optax.adam(task_lib.LR), **transforms(sparsity, 0)}, params, dataset, batches
  )
  other = jaxpruner_row()
  rows = [
    ['dense', '0', mean_std(accuracy['dense', 0.0]), '0.000', f'{1e3 * times["dense"]:.2f}', '1.00']
  ]
  for name in ('GMP', 'static', 'SET', 'RigL'):
    for s in task_lib.SPARSITIES:
      timed = s == sparsity
      rows.append(
        [
          name,
          f'{s}',
          mean_std(accuracy[name, s]),
          f'{statistics.mean(reached[name, s]):.3f}',
          f'{1e3 * times[name]:.2f}' if timed else '',
          f'{times[name] / times["dense"]:.2f}' if timed else '',
        ]
      )
  if 'error' in other:
    rows.append(['jaxpruner RigL', '', f'did not run: {other["error"]}', '', '', ''])
  else:
    for s in task_lib.SPARSITIES:
      timed = s == sparsity
      ms = other['step_ms']
      rows.append(
        [
          f'jaxpruner RigL ({other["versions"]})',
          f'{s}',
          mean_std(other['accuracy'][str(s)]),
          '',
          f'{ms["rigl"]:.2f}' if timed else '',
          f'{ms["rigl"] / ms["dense"]:.2f} (its dense: {ms["dense"]:.2f} ms)' if timed else '',
        ]
      )
  print(
    table(
      [
        'method',
        'sparsity',
        'test accuracy % (3 seeds)',
        'kernel sparsity reached',
        'step ms',
        'step time / dense',
      ],
      rows,
    )
  )


if __name__ == '__main__':
  main()
