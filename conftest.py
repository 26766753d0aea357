"""What pytest needs beyond pyproject.toml's settings."""

import pathlib

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
