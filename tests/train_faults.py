"""Faults for the main job's crash-safety tests: kills and full disks in the middle of writes.

Used in two ways:

* in the test process, `fail_writes(basename, at)` makes the `at`-th write to
  a file of that name (or its `.tmp`) store half its bytes, then raise
  OSError(ENOSPC): a full disk in the middle of a write;
* as a script, `python train_faults.py WORKDIR FAULT [NUM_STEPS]` trains the
  tiny config below in WORKDIR until FAULT kills the process with SIGKILL (as
  `kill -9` or a power cut would, as far as the process can tell), leaving
  WORKDIR as such a crash does:

    kill-write:NAME:N         half-way through the N-th write to file NAME
    kill-checkpoint:POINT:N   inside the N-th checkpoint save, at POINT:
                                tmp-dir   its temporary directory was just made
                                commit    its arrays are written, not yet renamed
                                item      one item (meta) is committed, not the other
                                renamed   the step directory was renamed into place
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any


def tiny_config(
  num_steps: int = 60,
  prune_steps: tuple[int, int] = (10, 40),
  eval_every: int = 20,
  mesh_shape: tuple[int, ...] = (),
) -> Any:
  """A 32-16 MLP on digits, pruned to 80% over `prune_steps` (a mask update every
  third of it), checkpointed every 20 steps: the crash and sharding tests' model."""
  from jaxprune_train import _defaults as defaults

  begin, end = prune_steps
  frequency = (end - begin) // 3  # also the logging interval: a line at each mask update
  config = defaults.get_config()
  config.name = 'tiny'
  config.model.features = (32, 16)
  config.batch_size = 32
  config.optimizer.learning_rate = 1e-2
  config.num_steps = num_steps
  config.log_every = frequency
  config.eval_every = eval_every
  config.checkpoint_every = 20
  config.progress_bar = False
  config.tensorboard = False
  config.plots = False
  config.mesh_shape = mesh_shape
  config.pruning = defaults.pruning_config(
    config.pruning,
    begin_pruning_step=begin,
    end_pruning_step=end,
    pruning_frequency=frequency,
    sparsity_function_begin_step=begin,
    sparsity_function_end_step=end,
    target_sparsity=0.8,
  )
  return config


def _kill() -> None:
  os.kill(os.getpid(), signal.SIGKILL)


def _enospc(path: str) -> Callable[[], None]:
  def fail() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  return fail


class _HalfWriter:
  """A file whose next write stores half its bytes, then runs `fault`."""

  def __init__(self, file: Any, fault: Callable[[], None]):
    self._file, self._fault = file, fault

  def write(self, data: Any) -> int:
    self._file.write(data[: len(data) // 2])
    self._file.flush()
    self._fault()
    raise AssertionError('the fault returned')

  def __enter__(self) -> _HalfWriter:
    return self

  def __exit__(self, *exc: Any) -> None:
    self._file.close()

  def __getattr__(self, name: str) -> Any:
    return getattr(self._file, name)


@contextlib.contextmanager
def fail_writes(
  basename: str, at: int = 1, fault: Callable[[], None] | None = None
) -> Iterator[list[int]]:
  """Makes the `at`-th write to a file named `basename` (or `basename.tmp`) fail half-way.

  Args:
    basename: the file name, e.g. 'config.json' or 'metrics.jsonl'.
    at: which write fails, counting writes to such files from 1.
    fault: what happens after the half write; raises OSError(ENOSPC) by default.

  Yields:
    A one-element list holding the number of matching writes so far.
  """
  real_open = builtins.open
  count = [0]

  class _Counting:
    def __init__(self, file: Any, path: str):
      self._file, self._path = file, path

    def write(self, data: Any) -> int:
      count[0] += 1
      if count[0] == at:
        return _HalfWriter(self._file, fault or _enospc(self._path)).write(data)
      return self._file.write(data)

    def __enter__(self) -> _Counting:
      return self

    def __exit__(self, *exc: Any) -> None:
      self._file.close()

    def __iter__(self) -> Iterator[Any]:
      return iter(self._file)

    def __getattr__(self, name: str) -> Any:
      return getattr(self._file, name)

  def faulty_open(file: Any, mode: str = 'r', *args: Any, **kwargs: Any) -> Any:
    handle = real_open(file, mode, *args, **kwargs)
    name = os.path.basename(os.fspath(file)) if not isinstance(file, int) else ''
    if any(c in mode for c in 'wax') and name in (basename, basename + '.tmp'):
      return _Counting(handle, os.fspath(file))
    return handle

  builtins.open = faulty_open
  try:
    yield count
  finally:
    builtins.open = real_open


def _kill_in_checkpoint(point: str, at: int) -> None:
  """Patches orbax so that the process kills itself at `point` of the `at`-th save."""
  from orbax.checkpoint._src.path import atomicity

  if point == 'tmp-dir':
    # Each save makes three temporary directories: the step's, then one per item.
    real_create = atomicity._create_tmp_directory
    made = {'n': 0}

    async def create(*args, **kwargs):
      path = await real_create(*args, **kwargs)
      made['n'] += 1
      if made['n'] == 3 * (at - 1) + 1:
        _kill()
      return path

    atomicity._create_tmp_directory = create
    return
  real_finalize = atomicity.AtomicRenameTemporaryPath.finalize
  finalized = {'n': 0}

  async def finalize(self):
    # Each save finalizes its two items (state, meta), then the step directory.
    finalized['n'] += 1
    position = (finalized['n'] - 1) % 3
    save = (finalized['n'] - 1) // 3 + 1
    if save == at and (
      (point == 'commit' and position == 0) or (point == 'item' and position == 1)
    ):
      _kill()
    await real_finalize(self)
    if save == at and point == 'renamed' and position == 2:
      _kill()

  atomicity.AtomicRenameTemporaryPath.finalize = finalize


def main(argv: list[str]) -> None:
  workdir, fault = argv[1], argv[2]
  num_steps = int(argv[3]) if len(argv) > 3 else 60
  kind, *rest = fault.split(':')
  from jaxprune_train import _loop as loop

  if kind == 'kill-checkpoint':
    _kill_in_checkpoint(rest[0], int(rest[1]))
    loop.train(tiny_config(num_steps), workdir)
  elif kind == 'kill-write':
    with fail_writes(rest[0], int(rest[1]), _kill):
      loop.train(tiny_config(num_steps), workdir)
  raise SystemExit(f'the fault {fault!r} did not happen')


if __name__ == '__main__':
  main(sys.argv)
