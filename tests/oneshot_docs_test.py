"""The one-shot guide's example (docs/guides/oneshot.md) runs and prints these numbers."""

import contextlib
import io

from docs_blocks import code_cells


def test_docs_oneshot_example():
  blocks = code_cells('guides/oneshot.md')
  assert len(blocks) == 1, 'the one-shot guide has one code cell'
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(blocks[0], 'docs/guides/oneshot.md', 'exec'), {})
  printed = out.getvalue().strip().splitlines()
  assert printed[:3] == ['magnitude: relative output error 0.109',
                         'wanda: relative output error 0.092',
                         'sparsegpt: relative output error 0.033']
  errors = [float(line.split()[-1]) for line in printed[:3]]
  assert errors[2] < errors[1] < errors[0]            # SparseGPT < Wanda < magnitude here
  assert printed[3:] == ['True', 'None']
