"""Runs the gradual channel pruning guide's example (docs/guides/channels.md) as written."""

import contextlib
import io

import numpy as np
import pytest
from docs_blocks import code_cells


@pytest.mark.slow
def test_docs_gradual_channel_example_runs():
  blocks = code_cells('guides/channels.md')
  assert len(blocks) == 1
  namespace = {}
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(blocks[0], 'docs/guides/channels.md', 'exec'), namespace)  # noqa: S102
  # 50% of 64 and of 32 hidden units: 32 and 16 stay (multiples of round_to=8).
  summary = namespace['result'].summary()
  assert 'group 0: 64 -> 32' in summary and 'group 2: 32 -> 16' in summary
  kernels = [v['kernel'].shape for v in namespace['result'].variables['params'].values()]
  assert kernels == [(20, 32), (32, 16), (16, 10)]
  # The smaller model computes what the masked (trained) one does.
  model, params, x = namespace['model'], namespace['params'], namespace['x']
  np.testing.assert_allclose(
    namespace['logits'], model.apply({'params': params}, x), rtol=1e-5, atol=1e-5
  )
