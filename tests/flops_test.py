"""The FLOPs convention of every result (`jaxprune/_results/flops.py`), and the results that
report through it."""

import dataclasses

import pytest

from jaxprune._results import flops as _flops


def test_flops_kept_is_after_over_before_and_one_without_flops():
  assert _flops.flops_kept(1280, 512) == pytest.approx(0.4)
  assert _flops.flops_kept(0, 0) == 1.0


def test_flops_text_says_the_fraction_and_how_many_times_fewer():
  # 1 / 0.292 = 3.4247; 1 / 0.4 = 2.5.
  assert _flops.flops_text(0.292) == '29.2% kept, 3.42x fewer'
  assert _flops.flops_text(0.4) == '40.0% kept, 2.50x fewer'
  assert _flops.flops_text(0.0) == '0.0% kept, no FLOPs left'


def test_a_report_reads_its_two_counts():
  @dataclasses.dataclass
  class Result(_flops.FlopsReport):
    flops_before: float
    flops_after: float

  result = Result(1280.0, 512.0)
  assert result.flops_kept == pytest.approx(0.4)
  assert result.flops_line() == 'FLOPs 1.28e+03 -> 512 (40.0% kept, 2.50x fewer)'


def test_every_result_with_flops_reports_through_the_one_owner():
  from jaxprune.channels import Shrunk
  from jaxprune.structured import PruneResult
  from jaxprune_train._channels import ChannelResult

  for result in (PruneResult, Shrunk, ChannelResult):
    assert issubclass(result, _flops.FlopsReport)
    assert 'flops_kept' not in vars(result)  # none writes it again
  # The main job's result: per image, 4x fewer.
  shrunk = ChannelResult([('conv', 8, 16)], 400.0, 100.0, 1.5, 0.9, None)
  assert shrunk.flops_kept == 0.25
  assert shrunk.scalars()['flops_kept'] == 0.25
  assert '(25.0% kept, 4.00x fewer)' in shrunk.lines()[2]
  assert dataclasses.replace(shrunk, speedup=2.0).speedup == 2.0
