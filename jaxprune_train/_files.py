"""Writing a run's files safely: atomic replacement, the workdir lock, storage errors.

A file the job rewrites (`config.json`, `report.txt`, the plots, the trimmed
`metrics.jsonl` of a resumed run) is written to a temporary file, flushed to
disk and renamed over the old one, so a crash or a full disk in the middle of
the write leaves the previous version whole. The workdir is locked for the
whole run, so two runs cannot interleave their writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator

from jaxprune_train._errors import ConfigError, StorageError, WorkdirBusyError

LOCK_FILE = '.jaxprune-train.lock'

# Errors that mean "this storage cannot take the write", as opposed to a bug.
_STORAGE_ERRNOS = frozenset(
  {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)
# Orbax writes arrays with tensorstore, which reports an OS error inside a
# ValueError's message: "... Failed to write ...: File too large [os_error_code='27']".
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")


def atomic_write(path: str, data: str | bytes) -> None:
  """Replaces the file `path` with `data` in one step.

  Args:
    path: the file to write.
    data: text (written as UTF-8) or bytes.

  Raises:
    OSError: if the temporary file cannot be written; `path` is then unchanged.
  """
  tmp = f'{path}.tmp'
  try:
    with open(tmp, 'wb') as f:
      f.write(data.encode() if isinstance(data, str) else data)
      f.flush()
      # On disk before the rename, so that a power loss cannot leave an empty file.
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def storage_errno(err: BaseException) -> int | None:
  """The errno of a failed write for lack of space, quota or permission, else None."""
  if isinstance(err, OSError):
    return err.errno if err.errno in _STORAGE_ERRNOS else None
  match = _TENSORSTORE_ERRNO.search(str(err))
  if match and int(match.group(1)) in _STORAGE_ERRNOS:
    return int(match.group(1))
  return None


@contextlib.contextmanager
def writing(what: str, path: str, then: str) -> Iterator[None]:
  """Turns a storage failure inside the block into a one-line `StorageError`.

  Args:
    what: what is being written, e.g. 'the checkpoint of step 300'.
    path: where.
    then: what the user can do, e.g. 'the newest checkpoint is step 200; free
      some space, then run the same command to resume'.
  """
  try:
    yield
  except StorageError:
    raise
  except Exception as err:  # noqa: BLE001 -- only storage failures are converted
    code = storage_errno(err)
    if code is None:
      raise
    raise StorageError(
      f'cannot write {what} to {path}: {os.strerror(code)} [errno {code}]; {then}.'
    ) from err


def check_file(path: str, what: str) -> None:
  """Raises ConfigError unless `path` is absent or a regular file (or a link to one).

  Args:
    path: a file the run reads or replaces.
    what: what the run keeps there, e.g. 'metrics'.
  """
  if os.path.islink(path) and not os.path.exists(path):
    raise ConfigError(
      f'{path} is a symbolic link to {os.readlink(path)!r}, which does not '
      f'exist; restore its target, or remove the link to start the {what} '
      'afresh, then run the same command again.'
    )
  if os.path.lexists(path) and not os.path.isfile(path):
    kind = 'a directory' if os.path.isdir(path) else 'not a regular file'
    raise ConfigError(
      f'{path} is {kind}, where the run keeps its {what}; move it out of the '
      'way, then run the same command again.'
    )


@contextlib.contextmanager
def locked(workdir: str) -> Iterator[None]:
  """Holds `workdir`'s lock for the block, creating the directory if needed.

  The lock is an advisory `flock` on a file in the workdir: the kernel drops
  it when the process ends, however it ends, so a killed run never leaves
  the workdir locked.

  Raises:
    WorkdirBusyError: another run holds the lock.
    ConfigError: the workdir cannot be created or written to, or its lock file
      is a directory or a dangling link.
  """
  path = os.path.join(workdir, LOCK_FILE)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as err:
    raise ConfigError(
      f'--workdir={workdir!r} cannot be used ({err.strerror}: '
      f'{err.filename!r}); pick a directory you can write to.'
    ) from err
  check_file(path, 'lock')
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as err:
    raise ConfigError(
      f'--workdir={workdir!r} cannot be used ({err.strerror}: '
      f'{err.filename!r}); pick a directory you can write to.'
    ) from err
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 32, 0).decode(errors='replace').strip() or 'unknown'
      raise WorkdirBusyError(
        f'--workdir={workdir!r} is in use by another jaxprune-train run (pid {holder}); '
        'wait for it to end, or give this run another --workdir.'
      ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
    yield
  finally:
    os.close(fd)  # closing the descriptor releases the lock
