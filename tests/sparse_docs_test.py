"""The sparse-training guide's example (docs/guides/sparse.md) runs as written."""

import numpy as np
import pytest
from docs_blocks import code_cells

import jaxprune


@pytest.mark.slow
def test_docs_example(capsys):
  blocks = code_cells('guides/sparse.md')
  assert len(blocks) == 1
  scope = {}
  exec(blocks[0], scope)  # noqa: S102 - the guide's own code
  assert capsys.readouterr().out.split() == ['947', '9472']
  # ERK by hand: density = eps * sum(shape) / prod(shape), eps = 0.1 * 9472 / (192 + 138).
  eps = 0.1 * 9472 / 330
  want = {'Dense_0/kernel': round(eps * 192), 'Dense_1/kernel': round(eps * 138)}
  assert (
    {n: int(m.sum()) for n, m in jaxprune.named_leaves(scope['masks'])}
    == want
    == {'Dense_0/kernel': 551, 'Dense_1/kernel': 396}
  )
  for name, mask in jaxprune.named_leaves(scope['masks']):
    kernel = np.asarray(scope['params'][name.split('/')[0]]['kernel'])
    np.testing.assert_array_equal(kernel[~np.asarray(mask)], 0)
