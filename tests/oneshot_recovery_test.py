"""Fine-tuning a one-shot pruned model with its masks held (benchmarks/oneshot_recovery.py):
every pruned weight stays exactly zero through the steps, and the loss goes down."""

import jax
import numpy as np
import optax
import pytest

from benchmarks import charlm, oneshot_recovery
from jaxprune import oneshot

CONFIG = charlm.Config(layers=2, width=32, heads=2, hidden=64, seq_len=32, batch_size=8)


def text_batches(count, seed):
  """Batches of a repetitive English text as bytes: easy to learn in a few steps."""
  text = np.frombuffer(b'the quick brown fox jumps over the lazy dog. ' * 200, np.uint8)
  return charlm.sample_batches(text, CONFIG.batch_size, CONFIG.seq_len, count, seed)


def loss(params, batches):
  logits_fn = charlm.apply_fn(CONFIG)
  values = [
    optax.softmax_cross_entropy_with_integer_labels(logits_fn(params, b[:, :-1]), b[:, 1:]).mean()
    for b in batches
  ]
  return float(np.mean(values))


@pytest.mark.slow  # about 7 s
def test_masks_stay_held_and_the_loss_goes_down():
  params = charlm.init_params(CONFIG)
  calibration = [b[:, :-1] for b in text_batches(2, seed=1)]
  pruned, masks = oneshot.prune(
    charlm.apply_fn(CONFIG),
    params,
    calibration,
    method='wanda',
    nm='2:4',
    overrides={'^head/': None},
  )
  kernels = [m for m in jax.tree.leaves(masks) if m is not None]
  assert len(kernels) == 2 * 7  # q, k, v, o, gate, up, down in each block
  heldout = text_batches(2, seed=7)
  losses = []
  tuned = oneshot_recovery.finetune(
    CONFIG, pruned, masks, text_batches(20, seed=3), 3e-3, log=lambda i, v: losses.append(v)
  )
  assert len(losses) == 20
  for p, m in zip(
    jax.tree.leaves(tuned), jax.tree.leaves(masks, is_leaf=lambda x: x is None), strict=True
  ):
    if m is not None:
      m = np.asarray(m)
      assert np.all(np.asarray(p)[~m] == 0.0)  # exactly zero, not small
      assert m.mean() == 0.5  # 2 of every 4
  # The kept weights did move: fine-tuning trained them.
  moved = [
    not np.array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(tuned), jax.tree.leaves(pruned), strict=True)
  ]
  assert all(moved)
  assert loss(tuned, heldout) < loss(pruned, heldout) - 0.1


@pytest.mark.slow
def test_without_the_masks_pruned_weights_grow_back():
  """The control: the same fine-tuning without `masks` moves the pruned weights off zero,
  so the first test's zeros are the masks' doing."""
  params = charlm.init_params(CONFIG)
  calibration = [b[:, :-1] for b in text_batches(2, seed=1)]
  pruned, masks = oneshot.prune(
    charlm.apply_fn(CONFIG),
    params,
    calibration,
    method='wanda',
    sparsity=0.5,
    overrides={'^head/': None},
  )
  tuned = oneshot_recovery.finetune(CONFIG, pruned, None, text_batches(3, seed=3), 3e-3)
  up = np.asarray(tuned['block_0']['up']['kernel'])
  assert np.count_nonzero(up[~np.asarray(masks['block_0']['up']['kernel'])]) > 0
