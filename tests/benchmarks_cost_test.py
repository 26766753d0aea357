"""benchmarks/cost.py without its compiles: the tree it lowers, the verdicts, and a report that
names every goal (the measurements themselves take minutes: `python benchmarks/cost.py`)."""

import dataclasses

import jax
import pytest

from benchmarks import cost


def test_gpt2_small_shaped_tree():
  params = cost.gpt2_shapes(12, 768, 50257, 1024)
  leaves = jax.tree.leaves(params)
  assert len(leaves) == 148
  assert sum(x.size for x in leaves) == 124_439_808
  assert len(jax.tree.leaves(cost.gpt2_shapes(48, 768, 50257, 1024))) == 580


@pytest.mark.parametrize(
  'value, goal, at_least, expected',
  [
    (0.05, 0.1, False, 'met'),
    (3.69, 0.1, False, 'not met (by 3.59x)'),
    (1.2, 1.1, True, 'met'),
    (1.0, 1.1, True, 'not met (by 0.10x)'),
  ],
)
def test_verdict(value, goal, at_least, expected):
  assert cost.verdict(value, goal, at_least) == expected


def fake_results(sizes):
  head = {}
  for n in sizes.layers:
    head[n] = {'Adam': (1.0, 0, 447), 'nbytes': 400, 'leaves': 148, 'state': (90, 12)}
    for form, plan in cost.HEADLINE:
      head[n][form, plan] = (2.0 + n / 100, 20, 1191)  # seconds, temp bytes, kernels
  names = ('Adam', 'pruned', 'chained', 'pruned, update', 'chained, update', 'sort-based, update')
  counts = {name: dict.fromkeys(cost.HLO_OPS, 1) for name in names[:3]}
  return {
    'headline': head,
    'matrix': {
      (rule, form, plan): 0.5
      for rule in sizes.matrix_rules
      for form in cost.FORMS
      for plan in cost.PLANS
    },
    'steps': {
      model: {'per_step': dict.fromkeys(names, 0.01), 'counts': counts} for model in ('a', 'b')
    },
    'full': {
      'params': 124e6,
      'nbytes': 400,
      'rows': {('Adam', 'auto'): (1.0, 100), ('pruned', 'adaptive'): (1.1, 400)}
      | {('chained', 'adaptive'): (1.5, 400), (cost.PARAMS_SOURCE, 'adaptive'): (1.5, 120)},
    },
    'plans': {(m, p): 0.1 for m in ('histogram', 'exact') for p in cost.PLANS},
  }


def test_report_marks_every_goal():
  sizes = dataclasses.replace(cost.QUICK, layers=(1, 2))
  text = cost.report(sizes, fake_results(sizes), cost.PARTS)
  summary = text.split('### Summary')[1]
  for goal in (
    '1 temp <= 0.1x params',
    '2 non-update step <= 1.03x',
    '2 update step',
    '3 optimizer-step compile <= 3x',
    '3 compile ratio not growing 1 -> 2',
    '3 full-step compile <= 1.2x',
    '4 second plan kept only if >= 10% faster',
  ):
    assert goal in summary, goal
  rows = [line for line in summary.splitlines() if line.startswith('| ')][1:]
  # 5 headline rows x 3 goals, 4 matrix rules, 2 models x 3, 3 full-step rows x 2, 2 plan rows.
  assert len(rows) == len(cost.HEADLINE) * 3 + len(sizes.matrix_rules) + 2 * 3 + 3 * 2 + 2
  assert len(cost.HEADLINE) == 5
  assert all(row.endswith(('| met |', ') |', '| info |')) for row in rows), rows
  assert '| 3 full-step compile <= 1.2x | pruned, adaptive | 1.10x | met |' in summary
  # The full step's temp beyond Adam's, as a multiple of the params' bytes (400).
  assert (
    '| 1 temp <= 0.1x params | pruned, adaptive, full step | 0.75x | not met (by 0.65x) |'
    in summary
  )
  assert (
    '| 1 temp <= 0.1x params | pruned, mask_source=params, adaptive, full step | 0.05x | met |'
    in summary
  )
  assert '| 3 full-step compile <= 1.2x | chained, adaptive | 1.50x | not met (by 0.30x) |' in (
    summary
  )
  # The compile cells give the fused kernels beside the seconds.
  assert '| 1.0 (447 kernels) |' in text and '| 2.0 (2.01x, 1,191 kernels) |' in text
