"""The main job as N processes of one command: JAX's multi-controller runtime.

Every process runs the same program (`jaxprune-train` with the same flags but
`--process_id`); `jax.distributed.initialize` joins them first thing, and
`jax.devices()` then lists every process's devices, so the config's mesh spans
them all. What each process does:

* **data**: it computes the global batch order (a pure function of
  `(seed, step)`, as in one process) but gathers only the rows of its own
  devices, and the global batch is assembled from the processes' rows with
  `jax.make_array_from_process_local_data`;
* **checkpoints**: all processes save and restore together through orbax
  (each writes its own shards, process 0 the metadata, and process 0 renames
  the checkpoint into place once every process has written: one atomic
  commit for the job);
* **files**: process 0 holds the workdir's lock for the whole job and alone
  writes `metrics.jsonl`, TensorBoard events, `config.json`, the report, the
  plots and `pruned_model.bin`; the other processes print one line and stay
  quiet unless they fail.

A process that dies (`kill -9`, a lost host) stops the others, each with one
line. Those in a collective with it fail at once (its connections close) and
exit with status 1; JAX's coordination service aborts the rest itself, at once
when process 0 (the service) died, else once the dead process has missed its
heartbeats for `--heartbeat_timeout_seconds`, and the job's line replaces
JAX's message and stack trace (`_guard_stderr`).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxprune.train import _data as data
from jaxprune.train import _files as files
from jaxprune.train._errors import ConfigError, RunError, WorkdirBusyError, one_line

PROGRAM = 'jaxprune-train'
_MESSAGE_BYTES = 2048  # how much of process 0's lock error the others receive


def _lost(reason: str) -> str:
  # XLA repeats its prefix once per device: 'Error dispatching computation: ' x 4.
  reason = re.sub(r'(Error dispatching computation: )+', '', one_line(reason))
  return (
    f'{PROGRAM}: process {jax.process_index()} of {jax.process_count()}: the job lost '
    f'another process ({reason[:300]}); stopping. Launch the same '
    f'{jax.process_count()} commands again to resume from the newest checkpoint.'
  )


def stop_lost(reason: str) -> None:
  """Prints the lost-process line and ends this process at once (no shutdown barrier)."""
  sys.stdout.flush()
  print(_lost(reason), file=sys.stderr, flush=True)
  os._exit(1)  # a normal exit would wait for the dead process at JAX's shutdown barrier


# JAX's coordination client ends a process itself, from C++, when process 0
# (which runs the coordination service) dies or another process misses its
# heartbeats: this message, a stack trace, then SIGABRT. Nothing in the
# process runs after it, so a child forked before JAX starts passes stderr on
# and puts the job's line in place of the message and everything after it.
_JAX_FATAL = b'Terminating process because the JAX distributed service detected fatal errors'
_SET_LINE = b'\0jaxprune-lost-line:'  # how the process tells the child its line


# The distributed runtime's own log lines (glog's `E1128 03:03:31.55 5169
# coordination_service.cc:1549] ...`, several lines each, from the coordination
# service, its agent and the preemption manager) come just before its fatal message:
# they are held back for a few seconds, and dropped when that message follows.
_RUNTIME_LOG = re.compile(
  rb'^[EWF]\d{4} [\d:.]+ +\d+ (?:coordination_service|'
  rb'coordination_service_agent|preemption_sync_manager|client)'
  rb'\.(?:cc|h):',
  re.M,
)
_HOLD_SECONDS = 5.0


def _pass_stderr_on(source: int, target: int) -> None:
  """The child: copies `source` to `target` until every writer is gone, then exits."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the job, not for this copy
  line, lost, held, held_until = b'', False, b'', 0.0
  while True:
    wait = held_until - time.monotonic()
    if held and (wait <= 0 or not select.select([source], [], [], wait)[0]):
      os.write(target, held)  # no fatal error followed: the lines were news after all
      held = b''
      continue
    chunk = os.read(source, 65536)
    if not chunk:
      break
    if lost:
      continue
    start = chunk.find(_SET_LINE)
    if start >= 0:  # written in one piece, before anything JAX could stop
      end = chunk.index(b'\n', start)
      line, chunk = chunk[start + len(_SET_LINE) : end], chunk[:start] + chunk[end + 1 :]
    chunk, was_held, held = held + chunk, bool(held), b''
    at = chunk.find(_JAX_FATAL)
    if at >= 0:
      lost = True
      chunk = chunk[: chunk.rfind(b'\n', 0, at) + 1]
      log = _RUNTIME_LOG.search(chunk)
      os.write(target, chunk[: log.start() if log else len(chunk)] + line + b'\n')
      continue
    log = None if was_held else _RUNTIME_LOG.search(chunk)
    if was_held:
      held = chunk  # still within the moment the first held line started
    elif log:
      chunk, held, held_until = (
        chunk[: log.start()],
        chunk[log.start() :],
        (time.monotonic() + _HOLD_SECONDS),
      )
      os.write(target, chunk)
    else:
      os.write(target, chunk)
  os.write(target, held)
  os._exit(0)


def _guard_stderr() -> None:
  """Routes this process's stderr through `_pass_stderr_on` in a forked child."""
  sys.stderr.flush()
  source, sink = os.pipe()
  if os.fork() == 0:
    os.close(sink)
    _pass_stderr_on(source, os.dup(2))
  os.close(source)
  os.dup2(sink, 2)
  os.close(sink)


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


def _check_port_free(coordinator_address: str | None, process_id: int | None) -> None:
  """ConfigError when process 0's coordinator port is already taken on this machine.

  JAX's coordination service would crash the process (after a raw log line)
  when it cannot listen there.
  """
  if process_id != 0 or not coordinator_address or ':' not in coordinator_address:
    return
  port = coordinator_address.rsplit(':', 1)[1]
  if not port.isdigit():
    raise ConfigError(
      f'--coordinator_address={coordinator_address}: must be host:port, '
      'e.g. 10.0.0.1:1234 (the address of process 0).'
    )
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(('', int(port)))
    except OSError as err:
      raise ConfigError(
        f'--coordinator_address={coordinator_address}: process 0 cannot listen on port '
        f'{port} ({err.strerror}): another job (or an earlier run still ending) uses it; '
        'give every process another free port.'
      ) from None


def _check_agreement(num_processes: int | None, coordinator_address: str | None) -> None:
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
      f'at {coordinator_address}). Give every process the same --num_processes.'
    )


def initialize(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  heartbeat_timeout_seconds: int = 100,
  initialization_timeout: int = 30,
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
    initialization_timeout: how long to wait for every process to join, in seconds.

  Raises:
    ConfigError: the arguments do not describe a job, or the processes cannot join.
  """
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
  _guard_stderr()
  # JAX's service ends a process that cannot join (a duplicate --process_id, a job of
  # another size) from C++, with a stack trace: this line replaces them.
  joining = (
    f'{PROGRAM}: process {process_id} could not join the job at '
    f"{coordinator_address}: JAX's coordination service stopped it (a process "
    f'missing after {initialization_timeout} s, a --process_id given twice, or a job '
    'of another size). Give every process the same --coordinator_address and '
    '--num_processes, start them together, and give each its own '
    f'--process_id from 0 to {num_processes - 1 if num_processes else "N - 1"}.'
  )
  sys.stderr.flush()
  os.write(2, _SET_LINE + joining.encode() + b'\n')
  try:
    jax.distributed.initialize(
      coordinator_address,
      num_processes,
      process_id,
      initialization_timeout=initialization_timeout,
      heartbeat_timeout_seconds=heartbeat_timeout_seconds,
      shutdown_timeout_seconds=heartbeat_timeout_seconds,
    )
  except (ValueError, TypeError, RuntimeError) as err:
    raise ConfigError(
      f'--coordinator_address={coordinator_address} --num_processes={num_processes} '
      f'--process_id={process_id}: the processes could not join within '
      f'{initialization_timeout} s ({one_line(str(err))[:300]}); give every process the '
      'same address of process 0 and number of processes, each its own id from 0, and '
      'start them together (or raise --initialization_timeout_seconds).'
    ) from err
  _check_agreement(num_processes, coordinator_address)
  sys.stderr.flush()
  os.write(2, _SET_LINE + _lost("JAX's coordination service stopped this process").encode() + b'\n')


def is_primary() -> bool:
  """Whether this process writes the job's files (process 0; always so in one process)."""
  return jax.process_index() == 0


def multiprocess() -> bool:
  """Whether the job has more than one process."""
  return jax.process_count() > 1


def describe() -> str:
  """'process 1 of 2, 4 of 8 devices' for the line a process prints first."""
  return (
    f'process {jax.process_index()} of {jax.process_count()}, '
    f'{jax.local_device_count()} of {jax.device_count()} devices'
  )


def check_mesh(mesh_shape: Any) -> None:
  """Raises ValueError when a job of several processes is given no mesh."""
  if not mesh_shape and multiprocess():
    n = jax.device_count()
    raise ValueError(
      f'mesh_shape={tuple(mesh_shape or ())!r} runs on one device, but this job has '
      f'{jax.process_count()} processes with {n} devices; give a (data, model) mesh using '
      f'all of them, e.g. --config.mesh_shape="({n},1)".'
    )


def agree(ok: bool) -> bool:
  """True when `ok` holds in every process (a collective: all processes call it)."""
  if not multiprocess():
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def host_copy(tree: Any) -> Any:
  """`tree` with every array whole in this process's memory (a collective with several).

  In one process, `tree` itself: its arrays are already addressable here.
  """
  if not multiprocess():
    return tree
  return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name`."""
  if multiprocess():
    multihost_utils.sync_global_devices(name)


def _process_rows(sharding: NamedSharding, batch_size: int) -> tuple[int, int]:
  """The rows `[start, stop)` of a batch that this process's devices hold."""
  slices = [index[0] for index in sharding.addressable_devices_indices_map((batch_size,)).values()]
  rows = sorted({(s.start or 0, batch_size if s.stop is None else s.stop) for s in slices})
  start, stop = rows[0][0], rows[-1][1]
  if sum(b - a for a, b in rows) != stop - start:
    raise ValueError(
      f'the devices of process {jax.process_index()} hold rows {rows} of the '
      'batch, not one contiguous range; use a mesh whose "data" axis runs '
      'over the processes in order (jax.make_mesh does).'
    )
  return start, stop


def batch_feed(
  dataset: data.Dataset, seed: int, batch_size: int, mesh: Mesh | None
) -> Callable[[int], tuple[Any, Any]]:
  """`feed(step) -> (x, y)`: the training batch of `step`, this process's rows only.

  In one process the batch is the host arrays of `data.get_batch`; with
  several, global arrays split over the mesh's `data` axis, built from the
  rows each process gathers (the same rows, in the same order, as one process).
  """
  if not multiprocess():
    return lambda step: data.get_batch(dataset, seed, step, batch_size)
  sharding = NamedSharding(mesh, P('data'))
  start, stop = _process_rows(sharding, batch_size)
  n = len(dataset.y_train)

  def feed(step: int) -> tuple[jax.Array, jax.Array]:
    index = data.batch_indices(seed, step, n, batch_size)[start:stop]
    x, y = dataset.x_train[index], dataset.y_train[index]
    return (
      jax.make_array_from_process_local_data(sharding, x, (batch_size, *x.shape[1:])),
      jax.make_array_from_process_local_data(sharding, y, (batch_size,)),
    )

  return feed


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
  """Holds the workdir's lock for the whole job: process 0 takes it, the others learn the outcome.

  Raises, in every process, what process 0's `files.locked` raises
  (`WorkdirBusyError`, `ConfigError`).
  """
  if not multiprocess():
    with files.locked(workdir):
      yield
    return
  with contextlib.ExitStack() as stack:
    failure: RunError | None = None
    if is_primary():
      try:
        stack.enter_context(files.locked(workdir))
      except RunError as err:
        failure = err
    code = 0 if failure is None else 1 + isinstance(failure, WorkdirBusyError)
    text = f'{code}{failure or ""}'.encode()[:_MESSAGE_BYTES]
    buffer = np.zeros(_MESSAGE_BYTES, np.uint8)
    buffer[: len(text)] = np.frombuffer(text, np.uint8)
    received = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    message = bytes(received).rstrip(b'\0').decode(errors='replace')
    if message[0] != '0':
      error = WorkdirBusyError if message[0] == '2' else ConfigError
      raise error(message[1:])
    yield


# What a collective or a barrier raises when another process of the job is gone.
_LOST_SIGNS = (
  'Gloo',
  'Connection closed',
  'Connection reset',
  'UNAVAILABLE',
  'heartbeat',
  'DEADLINE_EXCEEDED',
  'Barrier',
)


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
  """Runs `fn(*args)`; with several processes, a failure ends this process at once.

  A `RunError` (the same in every process: a config, a diverged loss) goes to
  the caller. Anything else would leave the other processes waiting for this
  one in a collective, so it prints one line (a lost process) or its
  traceback (a bug) and exits without JAX's shutdown barrier, which makes the
  others stop too.
  """
  if not multiprocess():
    return fn(*args)
  try:
    return fn(*args)
  except RunError:
    raise
  except KeyboardInterrupt:
    sys.stdout.flush()
    print(
      f'\n{PROGRAM}: process {jax.process_index()} interrupted; the other processes stop '
      f'too. Launch the same {jax.process_count()} commands again to resume from the '
      'newest checkpoint.',
      file=sys.stderr,
      flush=True,
    )
    os._exit(130)
  except Exception as err:  # noqa: BLE001 -- see the docstring
    if isinstance(err, jax.errors.JaxRuntimeError) and any(s in str(err) for s in _LOST_SIGNS):
      stop_lost(str(err))
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
