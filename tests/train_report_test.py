"""Tests for jaxprune_train._report: the end-of-run table."""

from jaxprune_train._report import LeafReport, RunReport, format_report


def _report(dense=0.95):
  leaves = [
    LeafReport('Dense_0/kernel', (4, 5), 2, 0.9, 0.9, 0.125),
    LeafReport('Dense_1/kernel', (5, 2), 5, 0.5, 0.5, 0.0625),
  ]
  return RunReport(
    leaves,
    total_params=37,
    total_nonzero=14,
    dense_accuracy=dense,
    dense_step=50,
    final_accuracy=0.9375,
    final_step=300,
  )


def test_table_rows_and_totals():
  lines = format_report(_report()).splitlines()
  assert lines[0].split() == [
    'leaf',
    'shape',
    'params',
    'nonzero',
    'target',
    'achieved',
    'threshold',
  ]
  assert lines[2].split() == ['Dense_0/kernel', '4x5', '20', '2', '0.900', '0.900', '0.125']
  assert lines[3].split() == ['Dense_1/kernel', '5x2', '10', '5', '0.500', '0.500', '0.0625']
  # Totals over pruned leaves: 30 params, 7 nonzero; target weighted by size
  # (0.9 * 20 + 0.5 * 10) / 30 = 0.7667; achieved 1 - 7/30 = 0.7667.
  assert lines[5].split() == ['all', 'pruned', 'leaves', '30', '7', '0.767', '0.767']
  # 14 of 37 nonzero: 23/37 = 62.2% zero.
  assert lines[6] == 'all params: 37, nonzero: 14 (62.2% zero)'
  # 93.75% - 95.00% = -1.25 points.
  assert lines[7] == (
    'test accuracy: dense at start of pruning (step 50) 95.00%, '
    'final (step 300) 93.75% (-1.25 points)'
  )


def test_without_dense_accuracy_or_pruned_leaves():
  text = format_report(_report(dense=None)._replace(leaves=[]))
  assert text.splitlines() == [
    'no pruned leaves',
    'all params: 37, nonzero: 14 (62.2% zero)',
    'test accuracy: final (step 300) 93.75%',
  ]


def test_pattern_column_appears_for_blocks_and_nm():
  report = _report()
  report = report._replace(
    leaves=[
      report.leaves[0]._replace(block=(4, 4)),
      report.leaves[1]._replace(nm=(1, 2), threshold=None),
    ]
  )
  lines = format_report(report).splitlines()
  assert lines[0].split()[-1] == 'pattern'
  assert lines[2].split()[-1] == '4x4'
  # N:M leaves have no threshold.
  assert lines[3].split()[-2:] == ['-', '1:2']


def test_global_pruning_says_the_target_is_shared():
  lines = format_report(_report()._replace(global_target=0.9)).splitlines()
  assert lines[6] == (
    'global pruning: one threshold across the pruned leaves; the target 0.900 '
    'holds for them together, not for each.'
  )
  assert lines[7].startswith('all params: 37')
