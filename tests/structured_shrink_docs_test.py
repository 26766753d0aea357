"""Runs the structured guide's select/shrink/deploy cells (docs/guides/structured.md) in order."""

import contextlib
import io

import jax
import numpy as np
import pytest
from docs_blocks import code_cells


@pytest.mark.slow
def test_docs_removing_channels_examples_run():
  blocks = code_cells('guides/structured.md', start='## Select, shrink, verify')
  assert len(blocks) == 6, (
    'Linen one-liner and steps, deploy, fine-tuning, Linen rebuild, linen_resized, NNX'
  )
  namespace = {}
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for block in blocks:
      exec(compile(block, 'docs/guides/structured.md', 'exec'), namespace)  # noqa: S102
  # what the guide's comments claim.
  summary = namespace['result'].summary()
  # unrounded (the default round_to=1): 19 x 30 of 32 x 64 channels keep 0.3 of the FLOPs.
  assert 'group 0: 32 -> 19' in summary and 'group 1: 64 -> 30' in summary
  assert '3.42x fewer' in summary
  # both checks, named: the exactness check and the distance from the dense model.
  assert 'exactness check against the masked model' in summary
  assert 'vs the dense model on the example inputs (8 examples)' in summary
  # the fine-tuning cell trained the params of the pruned callable, nothing else.
  tuned, pruned = namespace['tuned'], namespace['result'].variables
  assert tuned['batch_stats'] is pruned['batch_stats']
  assert jax.tree.map(np.shape, tuned) == jax.tree.map(np.shape, pruned)
  assert not np.array_equal(tuned['params']['Dense_0']['bias'], pruned['params']['Dense_0']['bias'])
  assert namespace['sizes'] == {'Conv_0': 16, 'Conv_1': 32, 'Dense_0': 10}
  assert namespace['net'].conv.out_features == 16
  # the deployed model: batch 3, from a serialised export with a symbolic batch.
  assert str(namespace['restored'].in_avals[-1].shape) == '(b, 32, 32, 3)'
  ones = np.ones((3, 32, 32, 3), np.float32)
  np.testing.assert_allclose(
    namespace['served'],
    namespace['pruned_fn'](namespace['new_variables'], ones),
    rtol=1e-5,
    atol=1e-5,
  )
