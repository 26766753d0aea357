"""Code cells added to the migration and benchmarks pages run as written, with numbers
worked out by hand."""

import matplotlib

matplotlib.use('Agg')

import pytest
from docs_blocks import code_cells  # noqa: E402


@pytest.mark.slow
def test_jaxpruner_rigl_cell_prints_the_erk_counts(capsys):
  [cell] = code_cells('migration/jaxpruner.md')
  exec(cell, {})  # noqa: S102 - the page's own code
  # ERK: density = eps * sum(shape) / prod(shape), with eps such that 10% of the
  # 16,384 + 2,560 weights are kept: eps = 0.1 * 18944 / (320 + 266).
  eps = 0.1 * 18944 / (320 + 266)
  kept = [round(eps * 320), round(eps * 266)]
  assert kept == [1034, 860]
  assert capsys.readouterr().out.splitlines() == [
    'Dense_0/kernel: 1,034 of 16,384 kept (93.7% sparse)',
    'Dense_1/kernel: 860 of 2,560 kept (66.4% sparse)',
  ]


@pytest.mark.slow
def test_benchmarks_glance_reaches_the_target_with_both_rules():
  cells = code_cells(
    'benchmarks.md', '## The schedule and the mask update at a glance', '## Zhu & Gupta on digits'
  )
  scope = {}
  exec(cells[0], scope)  # noqa: S102 - the page's own code
  # The exact rule keeps round(N / 10) of each kernel; the histogram one lands at most
  # one bin (1/256 of the range) below, never above.
  assert scope['achieved']['exact'][-1] == 0.9
  assert 0.9 - 1 / 256 <= scope['achieved']['histogram'][-1] <= 0.9
  # The two achieved lines lie on each other: the one drawn on top (exact) is dashed and
  # thinner, so the one under it, and so every entry of the legend, can be seen.
  lines = {line.get_label(): line for line in scope['ax'].get_lines()}
  legend = [text.get_text() for text in scope['ax'].get_legend().get_texts()]
  assert sorted(legend) == sorted(lines)
  under, over = lines['achieved (histogram)'], lines['achieved (exact)']
  assert scope['ax'].get_lines().index(over) > scope['ax'].get_lines().index(under)
  assert over.get_linestyle() == '--' and over.get_linewidth() < under.get_linewidth()
  for cell in cells[1:]:
    exec(cell, scope)  # noqa: S102
  speedup = scope['speedup']
  assert speedup['H200, CPU plan (2026-11-27)']['exact'] < 1 < speedup['CPU, 2 cores']['exact']
