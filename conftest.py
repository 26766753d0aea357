"""What pytest needs beyond pyproject.toml's settings."""

import os
import pathlib

# The tests compile hundreds of small programs and run each a few times, so XLA's CPU
# backend would spend most of the suite in LLVM's optimisation passes. JAX's own switch
# skips them (a third of the suite's CPU time). XLA's graph passes (fusion, buffer
# assignment, sharding), which the memory and HLO tests read, run as for users, and the
# subprocesses the tests start inherit it. `JAX_DISABLE_MOST_OPTIMIZATIONS=0 pytest`
# compiles as users do (the suite passes either way).
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')

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
