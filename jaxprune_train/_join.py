"""Joining the processes of a multi-process job, or one line saying why they could not.

`initialize` checks the flags it can check alone (the address's form and
port, process 0's port), then joins with `jax.distributed.initialize` under a
watchdog (`_process.watchdog`): JAX's own timeout ends a process that cannot join with a fatal
error (SIGABRT), so the watchdog, a thread that runs while JAX waits, ends it
first, with the job's line and status 1, `--initialization_timeout_seconds`
after the process started. Ctrl-C while joining ends it at once (status 130).
"""

from __future__ import annotations

import collections
import ipaddress
import os
import re
import socket
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxprune_train import _process as process
from jaxprune_train._entry import PROGRAM
from jaxprune_train._errors import ConfigError, one_line

_JAX_MARGIN_SECONDS = 30  # JAX's own join timeout is this much later than the watchdog


def check_address(address: str | None) -> None:
  """ConfigError unless `address` is `host:port` with a port JAX can use (None passes).

  Checked in every process before joining: JAX fails on a malformed one with
  an IndexError or an OverflowError, or waits for a host that does not exist.
  """
  if address is None:
    return
  example = 'the address of process 0 and a free port, e.g. 10.0.0.1:1234 or [::1]:1234'
  match = re.fullmatch(r'(\[[^\]]*\]|[^\s:\[\]]*):([^:]*)', address)
  if not match or not match.group(1) or not match.group(2):
    raise ConfigError(f'--coordinator_address={address!r}: must be host:port: {example}.')
  host, port = match.group(1).strip('[]'), match.group(2)
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ConfigError(
      f'--coordinator_address={address!r}: the port {port!r} must be a number from 1 to '
      f'65535: {example}.'
    )
  if match.group(1).startswith('['):
    try:
      ipaddress.IPv6Address(host)
    except ValueError:
      raise ConfigError(
        f'--coordinator_address={address!r}: {host!r} in brackets must be an IPv6 address: '
        f'{example}.'
      ) from None
  try:
    socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
  except (OSError, UnicodeError) as err:
    raise ConfigError(
      f'--coordinator_address={address!r}: the host {host!r} cannot be found '
      f'({getattr(err, "strerror", None) or err}); give the address or name of the '
      'machine of process 0.'
    ) from None


def _check_port_free(address: str | None, process_id: int | None) -> None:
  """ConfigError when process 0's coordinator port is already taken on this machine.

  JAX's coordination service would crash the process (after a raw log line)
  when it cannot listen there.
  """
  if process_id != 0 or not address:
    return
  port = address.rsplit(':', 1)[1]
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(('', int(port)))
    except OSError as err:
      raise ConfigError(
        f'--coordinator_address={address}: process 0 cannot listen on port '
        f'{port} ({err.strerror}): another job (or an earlier run still ending) uses it; '
        'give every process another free port.'
      ) from None


def check_device_counts(devices: Sequence[Any]) -> None:
  """ConfigError in every process when the processes expose different numbers of devices.

  Read off `jax.devices()`, which lists every process's devices once joined, so no
  collective runs (JAX's `process_allgather` and the mesh assume the same count in each
  process and fail on a reshape).

  Args:
    devices: the job's devices (`jax.devices()`), each with its `process_index`.
  """
  counts = collections.Counter(device.process_index for device in devices)
  if len(set(counts.values())) > 1:
    seen = ', '.join(f'{counts[i]} in process {i}' for i in sorted(counts))
    raise ConfigError(
      f'the processes of this job expose different numbers of devices ({seen}); every '
      'process must expose the same number: give each the same count (the same number of '
      'GPUs in CUDA_VISIBLE_DEVICES, or the same XLA_FLAGS='
      '--xla_force_host_platform_device_count on CPU) and start them all again.'
    )


def _check_sizes(num_processes: int | None, address: str | None) -> None:
  """ConfigError in every process when they were given different --num_processes.

  JAX takes the count of process 0 (which runs the coordination service) and
  would let the others train as part of a job of another size without a word.
  """
  given = multihost_utils.process_allgather(
    np.int32(-1 if num_processes is None else num_processes)
  )
  counts = [int(n) for n in np.ravel(given)]
  if any(n not in (-1, jax.process_count()) for n in counts):
    raise ConfigError(
      f'the processes were given different --num_processes ({counts}, by process id; -1: '
      f'not given), and JAX joined {jax.process_count()} of them (the count of process 0, '
      f'at {address}). Give every process the same --num_processes.'
    )


def seconds_since_start() -> float:
  """How long this process has run (0 where the system does not say)."""
  try:
    with open('/proc/self/stat') as f:
      started = int(f.read().rsplit(')', 1)[1].split()[19])  # field 22: starttime, in ticks
    with open('/proc/uptime') as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - started / os.sysconf('SC_CLK_TCK'))
  except (OSError, ValueError, IndexError):
    return 0.0


def _detected_cluster() -> str | None:
  """The name of the cluster JAX's auto-detection finds (SLURM, Open MPI, a TPU pod), or None."""
  try:
    from jax._src import clusters

    for env in clusters.ClusterEnv._cluster_types:  # noqa: SLF001 -- JAX's own detection
      if not env.opt_in_only_method and env.is_env_present():
        return env.__name__
  except Exception:  # noqa: BLE001 -- no detection in this JAX: flags only
    return None
  return None


def initialize(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  heartbeat_timeout_seconds: int = 100,
  initialization_timeout: int = 25,
) -> None:
  """Joins the job's processes with `jax.distributed.initialize`, if this is one.

  Must run before anything touches JAX's devices. With none of the three
  arguments and no cluster detected (or `num_processes=1` without an
  address), it does nothing: a one-process run. Arguments left None are found
  by JAX's cluster auto-detection (SLURM, Open MPI, Cloud TPU pod slices).
  One process with an address is a job of one: its devices then sum across
  each other with gloo, as a job of several does, and so end bit for bit as it.

  Args:
    coordinator_address: 'host:port' of process 0, reachable from every process.
    num_processes: how many processes the job has.
    process_id: this process's index, 0 to num_processes - 1.
    heartbeat_timeout_seconds: how long a silent process is given before the
      job is stopped.
    initialization_timeout: how long after its start the process waits for
      every process to join, in seconds; then it ends with one line, status 1.

  Raises:
    ConfigError: the arguments do not describe a job, or the processes cannot join.
  """
  check_address(coordinator_address)
  given = (coordinator_address, num_processes, process_id)
  if (num_processes == 1 and coordinator_address is None) or (
    given == (None, None, None) and _detected_cluster() is None
  ):
    return
  if num_processes == 1 and process_id is None:
    process_id = 0
  _check_port_free(coordinator_address, process_id)
  # CPU devices need a collectives library to reach other processes.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  process.guard()
  waited = max(1.0, initialization_timeout - seconds_since_start())
  last_id = num_processes - 1 if num_processes else 'N - 1'
  could_not = (
    f'{PROGRAM}: process {process_id} could not join the job at {coordinator_address} '
    f'within {initialization_timeout} s of its start'
  )
  fix = (
    'Give every process the same --coordinator_address and --num_processes, start them '
    f'together, and give each its own --process_id from 0 to {last_id} (or raise '
    '--initialization_timeout_seconds).'
  )
  # JAX's service may end a process that cannot join (a duplicate --process_id)
  # from C++, with a stack trace: this line replaces them.
  process.set_fatal_line(
    f'{PROGRAM}: process {process_id} could not join the job at {coordinator_address}: '
    f"JAX's coordination service stopped it (a --process_id given twice, or a job of "
    f'another size). {fix}'
  )
  interrupted = f'{PROGRAM}: interrupted while joining the job; nothing was written.'
  missing = (
    f'{could_not}: a process is missing (not started, or stopped by an error of its own), '
    f'a --process_id was given twice, or the processes were given different '
    f'--num_processes. {fix}'
  )
  try:
    with process.watchdog(waited, missing, interrupted), process.aborts_as_exit(1):
      jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        initialization_timeout=int(waited) + _JAX_MARGIN_SECONDS,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        shutdown_timeout_seconds=heartbeat_timeout_seconds,
      )
  except (ValueError, TypeError, RuntimeError) as err:
    raise ConfigError(
      f'--coordinator_address={coordinator_address} --num_processes={num_processes} '
      f'--process_id={process_id}: the processes could not join ('
      f'{one_line(str(err))[:300]}); give every process the same address of process 0 and '
      'number of processes, each its own id from 0, and start them together.'
    ) from err
  check_device_counts(jax.devices())
  _check_sizes(num_processes, coordinator_address)
  from jaxprune_train import _distributed as distributed

  process.set_fatal_line(distributed.lost_line("JAX's coordination service stopped this process"))
  process.joined()
