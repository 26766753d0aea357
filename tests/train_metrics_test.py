"""Tests for jaxprune_train._metrics: metrics.jsonl, TensorBoard events, resume."""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune_train import _metrics as metrics


def _lines(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_records_are_json_with_python_types(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  writer.write(10, {'loss': jnp.float32(0.5), 'count': np.int32(3), 'zero': np.float32(0.0)})
  writer.close()
  [record] = _lines(tmp_path)
  assert record == {'step': 10, 'loss': 0.5, 'count': 3, 'zero': 0.0}
  assert isinstance(record['count'], int) and isinstance(record['zero'], float)


def test_resume_drops_records_after_the_checkpoint(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  for step in (10, 20, 30, 40):
    writer.write(step, {'loss': step / 100})
  writer.close()
  resumed = metrics.MetricsWriter(str(tmp_path), resume_step=20, tensorboard=False)
  resumed.write(30, {'loss': 0.25})
  resumed.close()
  assert [(r['step'], r['loss']) for r in _lines(tmp_path)] == [(10, 0.1), (20, 0.2), (30, 0.25)]
  assert resumed.history == _lines(tmp_path)
  assert metrics.read_metrics(str(tmp_path)) == _lines(tmp_path)


def test_resume_keeps_the_records_of_the_restored_step_and_drops_the_next(tmp_path):
  # A run checkpointed at step 20 resumes from it: the records of step 20 are
  # its history, those of step 21 (logged before a crash) are redone and must
  # not be kept twice.
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  for step in (19, 20, 20, 21, 22):
    writer.write(step, {'loss': step / 100})
  writer.close()
  resumed = metrics.MetricsWriter(str(tmp_path), resume_step=20, tensorboard=False)
  resumed.close()
  assert [r['step'] for r in _lines(tmp_path)] == [19, 20, 20]
  assert [r['step'] for r in resumed.history] == [19, 20, 20]


def test_a_line_out_of_step_order_is_dropped_on_rerun(tmp_path):
  """`{"step": 999, "loss": NaN}` appended to a finished run's file: the job writes steps in
  order, so a step below an earlier line's was not written by it; a rerun drops it."""
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  for step in (1000, 2000, 3000):
    writer.write(step, {'loss': 0.1})
  writer.close()
  with open(os.path.join(tmp_path, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 999, "loss": NaN}\n')
  with pytest.warns(UserWarning, match='line 4 has step 999 after step 3000'):
    rerun = metrics.MetricsWriter(str(tmp_path), resume_step=3000, tensorboard=False)
  rerun.close()
  assert [r['step'] for r in _lines(tmp_path)] == [1000, 2000, 3000]


def test_memory_only_writer_keeps_history(tmp_path):
  writer = metrics.MetricsWriter(None)
  writer.write(1, {'a': 2.0})
  writer.close()
  assert writer.history == [{'step': 1, 'a': 2.0}]
  assert os.listdir(tmp_path) == []


def _read_events(directory):
  """Reads scalar summaries from TFRecord event files: (tag, step, value) triples."""
  from tensorboardX.proto import event_pb2

  scalars = []
  for name in sorted(os.listdir(directory)):
    with open(os.path.join(directory, name), 'rb') as f:
      blob = f.read()
    offset = 0
    while offset < len(blob):
      # TFRecord framing: uint64 length, uint32 crc, payload, uint32 crc.
      length = int.from_bytes(blob[offset : offset + 8], 'little')
      payload = blob[offset + 12 : offset + 12 + length]
      offset += 16 + length
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        scalars.append((value.tag, event.step, value.simple_value))
  return scalars


def test_tensorboard_events_hold_the_scalars(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=True)
  writer.write(5, {'loss': 0.75, 'Dense_0/kernel/sparsity': 0.5})
  writer.close()
  events = _read_events(tmp_path / 'tensorboard')
  assert sorted(events) == [('Dense_0/kernel/sparsity', 5, 0.5), ('loss', 5, 0.75)]


def test_without_tensorboardx_only_jsonl_is_written(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorboardX', None)  # makes the import fail
  with pytest.warns(UserWarning, match='tensorboardX is not installed; writing only '):
    writer = metrics.MetricsWriter(str(tmp_path), tensorboard=True)
  writer.write(1, {'loss': 0.5})
  writer.close()
  assert sorted(os.listdir(tmp_path)) == ['metrics.jsonl']
  assert _lines(tmp_path) == [{'step': 1, 'loss': 0.5}]
