"""The README's one-shot example runs and prints what it says."""

import contextlib
import io

from readme_blocks import python_blocks


def test_readme_oneshot_example():
  blocks = python_blocks('<!-- section:oneshot -->')
  assert len(blocks) == 1, 'the one-shot section has one python example'
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(blocks[0], 'README.md', 'exec'), {})
  printed = out.getvalue().strip().splitlines()
  promised = [line[2:] for line in blocks[0].splitlines() if line.startswith('# ')]
  assert printed[:3] == promised
  errors = [float(line.split()[-1]) for line in printed[:3]]
  assert errors[2] < errors[1] < errors[0]            # SparseGPT < Wanda < magnitude here
  assert printed[3:] == ['True', 'None']
