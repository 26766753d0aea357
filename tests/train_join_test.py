"""Joining a multi-process job: the address check, the device-count check, and the stderr
relay that puts the job's line in place of JAX's (all without starting a job;
tests/train_multiprocess_start_test.py starts real ones)."""

from typing import NamedTuple

import pytest

from jaxprune_train import _join as join
from jaxprune_train import _process as process

EXAMPLE = 'the address of process 0 and a free port, e.g. 10.0.0.1:1234 or [::1]:1234.'


@pytest.mark.parametrize(
  'address, message',
  [
    ('garbage', f"--coordinator_address='garbage': must be host:port: {EXAMPLE}"),
    ('10.0.0.1', f"--coordinator_address='10.0.0.1': must be host:port: {EXAMPLE}"),
    (':1234', f"--coordinator_address=':1234': must be host:port: {EXAMPLE}"),
    ('10.0.0.1:', f"--coordinator_address='10.0.0.1:': must be host:port: {EXAMPLE}"),
    ('a:b:1234', f"--coordinator_address='a:b:1234': must be host:port: {EXAMPLE}"),
    (
      '127.0.0.1:99999',
      "--coordinator_address='127.0.0.1:99999': the port '99999' must be a number from 1 to "
      f'65535: {EXAMPLE}',
    ),
    (
      '127.0.0.1:0',
      f"--coordinator_address='127.0.0.1:0': the port '0' must be a number from 1 to 65535: "
      f'{EXAMPLE}',
    ),
    (
      '127.0.0.1:12ab',
      "--coordinator_address='127.0.0.1:12ab': the port '12ab' must be a number from 1 to "
      f'65535: {EXAMPLE}',
    ),
    (
      '[not-v6]:1234',
      f"--coordinator_address='[not-v6]:1234': 'not-v6' in brackets must be an IPv6 address: "
      f'{EXAMPLE}',
    ),
  ],
)
def test_a_malformed_coordinator_address_is_one_line(address, message):
  with pytest.raises(join.ConfigError) as raised:
    join.check_address(address)
  assert str(raised.value) == message


@pytest.mark.parametrize('address', [None, '127.0.0.1:1234', 'localhost:65535', '[::1]:1'])
def test_well_formed_coordinator_addresses_pass(address):
  join.check_address(address)


class Device(NamedTuple):
  process_index: int


def test_processes_exposing_different_device_counts_are_one_line():
  """Process 0 with 4 devices, process 1 with 2: JAX's process_allgather failed with
  'cannot reshape array of size 6 into shape (2,2)' and a 42-line traceback."""
  devices = [Device(0)] * 4 + [Device(1)] * 2
  with pytest.raises(join.ConfigError) as raised:
    join.check_device_counts(devices)
  assert str(raised.value) == (
    'the processes of this job expose different numbers of devices (4 in process 0, 2 in '
    'process 1); every process must expose the same number: give each the same count (the '
    'same number of GPUs in CUDA_VISIBLE_DEVICES, or the same '
    'XLA_FLAGS=--xla_force_host_platform_device_count on CPU) and start them all again.'
  )
  join.check_device_counts([Device(0)] * 4 + [Device(1)] * 4 + [Device(2)] * 4)  # passes


FATAL = (
  b'F1129 00:15:40.087466    7624 client.h:80] Terminating process because the JAX '
  b'distributed service detected fatal errors. This most likely indicates that another '
  b'task died\n*** Check failure stack trace: ***\n    @     0x7f49  absl::LogMessage\n'
)
RUNTIME_LOG = (
  b'E1129 00:15:39.1  7624 coordination_service_agent.cc:403] Polled an error\n'
  b'Additional GRPC error information: {...}\n'
)


def _relay():
  written = []
  return process.Relay(written.append), written


def _marker(kind, text=''):
  return b'\0jaxprune-' + kind.encode() + b':' + text.encode() + b'\n'


def test_the_fatal_message_and_the_logs_before_it_become_the_line():
  relay, written = _relay()
  relay.feed(b'step 10\n' + _marker('fatal-line', 'jaxprune-train: the line'), 0.0)
  relay.feed(RUNTIME_LOG, 1.0)
  relay.feed(FATAL, 2.0)
  relay.feed(b'anything after it\n', 3.0)
  relay.end()
  assert b''.join(written) == b'step 10\njaxprune-train: the line\n'


def test_a_stop_line_ends_the_output_and_drops_what_was_held():
  relay, written = _relay()
  relay.feed(RUNTIME_LOG + _marker('stop-line', 'jaxprune-train: could not join'), 0.0)
  relay.feed(FATAL + b'more\n', 1.0)
  relay.end()
  assert b''.join(written) == b'jaxprune-train: could not join\n'


def test_runtime_logs_while_joining_are_dropped_and_after_joining_shown_late():
  relay, written = _relay()
  relay.feed(RUNTIME_LOG, 0.0)
  relay.tick(100.0)  # not joined: held for as long as the join lasts
  assert written == [b'']
  relay.feed(_marker('joined'), 100.0)
  relay.tick(100.0 + process.HOLD_SECONDS)  # joined: news after all, once no fatal followed
  assert b''.join(written) == RUNTIME_LOG
  relay.feed(RUNTIME_LOG, 200.0)
  relay.end()
  assert b''.join(written) == RUNTIME_LOG * 2
  relay, written = _relay()
  relay.feed(b'jaxprune-train: the job line\n' + RUNTIME_LOG, 0.0)
  relay.end()  # the process ended before it joined: its own line said why
  assert b''.join(written) == b'jaxprune-train: the job line\n'


def test_a_marker_read_in_two_pieces_is_still_a_marker():
  relay, written = _relay()
  marker = _marker('stop-line', 'jaxprune-train: the line')
  relay.feed(b'before\n' + marker[:9], 0.0)
  relay.feed(marker[9:] + b'after\n', 0.0)
  relay.end()
  assert b''.join(written) == b'before\njaxprune-train: the line\n'
