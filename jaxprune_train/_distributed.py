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
JAX's message and stack trace (`_process.py`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxprune_train import _data as data
from jaxprune_train import _files as files
from jaxprune_train import _process as process
from jaxprune_train._entry import PROGRAM
from jaxprune_train._errors import ConfigError, RunError, WorkdirBusyError, one_line

_MESSAGE_BYTES = 2048  # how much of process 0's lock error the others receive


def lost_line(reason: str) -> str:
  """The line a process prints when another process of the job is gone."""
  # XLA repeats its prefix once per device: 'Error dispatching computation: ' x 4.
  reason = re.sub(r'(Error dispatching computation: )+', '', one_line(reason))
  return (
    f'{PROGRAM}: process {jax.process_index()} of {jax.process_count()}: the job lost '
    f'another process ({reason[:300]}); stopping. Launch the same '
    f'{jax.process_count()} commands again to resume from the newest checkpoint.'
  )


def stop_lost(reason: str) -> NoReturn:
  """Prints the lost-process line and ends this process at once (no shutdown barrier)."""
  # A normal exit would wait for the dead process at JAX's shutdown barrier.
  process.stop(lost_line(reason), 1)


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
      jax.make_array_from_process_local_data(sharding, y, (batch_size, *y.shape[1:])),
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
    os.write(2, b'\n')  # off the progress bar's line
    process.stop(
      f'{PROGRAM}: process {jax.process_index()} interrupted; the other processes stop '
      f'too. Launch the same {jax.process_count()} commands again to resume from the '
      'newest checkpoint.',
      130,
    )
  except Exception as err:  # noqa: BLE001 -- see the docstring
    if isinstance(err, jax.errors.JaxRuntimeError) and any(s in str(err) for s in _LOST_SIGNS):
      stop_lost(str(err))
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
