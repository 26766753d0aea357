"""What pytest needs beyond pyproject.toml's settings."""

import os
import pathlib

import jax
import pytest

# The tests compile hundreds of small programs and run each a few times, so XLA's CPU
# backend would spend a third of the suite in LLVM's optimisation passes: JAX's own switch
# skips them, in the test processes and (through the environment) in the subprocesses the
# tests start (the main job, multi-device runs), so that a run killed in a subprocess and
# resumed here takes the same steps bit for bit. XLA's graph passes (fusion, buffer
# assignment, sharding), which the memory and HLO tests read, run as for users.
# `JAX_DISABLE_MOST_OPTIMIZATIONS=0 pytest` compiles as users do throughout.
if 'JAX_DISABLE_MOST_OPTIMIZATIONS' not in os.environ:
  os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'
  jax.config.update('jax_disable_most_optimizations', True)


_TESTS = pathlib.Path(__file__).resolve().parent / 'tests'


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
  """Keeps `--doctest-modules` from importing the helper scripts of tests/.

  pyproject's `--doctest-modules` imports every module under the test paths to find
  `>>>` examples. The helpers in tests/ that are not `*_test.py` files are imported by
  the tests or run as subprocesses; some set `XLA_FLAGS` when imported (8 simulated
  devices), which must not leak into the test processes.
  """
  path = pathlib.Path(collection_path)
  if (path.suffix == '.py' and path.parent == _TESTS and path.name != 'conftest.py'
      and not path.name.endswith('_test.py')):
    return True
  return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  """Puts the modules with slow tests first, those slow as a whole before the others.

  pyproject runs the suite on two workers a module at a time (`--dist loadfile`), so that
  a module's fixtures (a multi-process run, a subprocess on 8 devices, a compilation
  cache) are made once. A slow module started last would leave the other worker idle
  at the end; started first, the rest of the suite fills in beside it.
  """
  slow_modules = {item.path for item in items if item.get_closest_marker('slow')}

  def rank(item: pytest.Item) -> int:
    module = item.getparent(pytest.Module)
    if module is not None and any(m.name == 'slow' for m in module.own_markers):
      return 0
    return 1 if item.path in slow_modules else 2

  items.sort(key=rank)  # stable: each module's tests keep their order
