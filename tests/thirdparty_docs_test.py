"""Runs the recipes of docs/guides/thirdparty.md (haiku, equinox, transformers, keras)."""

import contextlib
import io

import jax
import numpy as np
import pytest
from docs_blocks import code_cells


@pytest.mark.slow  # four libraries' models built and pruned: ~15-40 s
def test_docs_thirdparty_recipes_run():
  haiku_block, equinox_block, hf_block, keras_block = code_cells('guides/thirdparty.md')
  namespace = {}

  def run(block):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
      exec(compile(block, 'docs/guides/thirdparty.md', 'exec'), namespace)  # noqa: S102
    return out.getvalue().split()

  # haiku MobileNetV1, 2 blocks: the stem's 32 channels with the first
  # depthwise conv, and each pointwise conv's output (the last one with the
  # logits' input). The BatchNorms' unread EMA `hidden` are not groups.
  # Then prune() makes the same calls in one, to at most 60% of the FLOPs.
  count, *flops_line = run(haiku_block)
  assert count == '3'
  assert namespace['logits'].shape == (1, 10)
  result = namespace['result']
  assert ' '.join(flops_line) == result.flops_line()
  assert result.flops_after <= 0.6 * result.flops_before and result.check.ok
  assert result.model(result.variables, namespace['x'][:1]).shape == (1, 10)

  # equinox MLP 16-64-64-4: two hidden widths; half of 64 stays.
  assert run(equinox_block) == ['2', '(32,', '16)']
  reloaded = jax.export.deserialize(namespace['blob'])
  x = namespace['x'][:3]
  np.testing.assert_allclose(
    reloaded.call(namespace['leaves'], x),
    namespace['pruned_fn'](namespace['new_params'], x),
    rtol=1e-6,
    atol=1e-6,
  )

  # BERT, 2 layers: heads, query/key head_dim, value/output head_dim and MLP
  # units per layer (4 x 2), and the pooler's units.
  assert run(hf_block) == ['9']
  assert namespace['logits'].shape == (1, 3)

  # keras CNN: each conv's output; 16 - floor(0.3 * 16) = 12 filters (a ratio is
  # never exceeded; the default round_to=1 does not round).
  assert run(keras_block) == ['2', '(3,', '3,', '3,', '12)']
