"""What pytest needs beyond pyproject.toml's settings."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

# The tests compile hundreds of small programs and run each a few times, so compiling is
# most of the suite's time. Two switches make it cheaper, in the test processes and
# (through the environment) in the subprocesses they start (the main job, multi-device
# runs), so that a run killed in a subprocess and resumed here takes the same steps bit for
# bit: JAX's `jax_disable_most_optimizations` skips LLVM's optimisation passes, and XLA's
# older CPU code generator (`--xla_cpu_use_fusion_emitters=false`) instead of its MLIR
# fusion emitters halves the CPU time of a module such as transform_pruned_test.py. XLA's
# graph passes (fusion, buffer assignment, sharding), which the memory and HLO tests read,
# run as for users.
# `JAX_DISABLE_MOST_OPTIMIZATIONS=0 pytest` compiles as users do throughout.
_FAST_CPU_CODEGEN = '--xla_cpu_use_fusion_emitters=false'


def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA accepts `flag` in XLA_FLAGS (it aborts on one it does not
  know, so the question is asked of a child process)."""
  env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS='cpu')
  probe = subprocess.run(
    [sys.executable, '-c', 'import jax; jax.devices()'], env=env, capture_output=True, check=False
  )
  return probe.returncode == 0


if 'JAX_DISABLE_MOST_OPTIMIZATIONS' not in os.environ:
  os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '1'
  jax.config.update('jax_disable_most_optimizations', True)
# Asked once: the xdist workers inherit the answer with the controller's environment.
if (
  jax.config.read('jax_disable_most_optimizations')
  and 'xla_cpu_use_fusion_emitters' not in os.environ.get('XLA_FLAGS', '')
  and _xla_knows(_FAST_CPU_CODEGEN)
):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {_FAST_CPU_CODEGEN}'.strip()


_TESTS = pathlib.Path(__file__).resolve().parent / 'tests'


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
  """Keeps `--doctest-modules` from importing the helper scripts of tests/.

  pyproject's `--doctest-modules` imports every module under the test paths to find
  `>>>` examples. The helpers in tests/ that are not `*_test.py` files are imported by
  the tests or run as subprocesses; some set `XLA_FLAGS` when imported (8 simulated
  devices), which must not leak into the test processes.
  """
  path = pathlib.Path(collection_path)
  if (
    path.suffix == '.py'
    and path.parent == _TESTS
    and path.name != 'conftest.py'
    and not path.name.endswith('_test.py')
  ):
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With `JAXPRUNE_TEST_TIMES=FILE`, appends each test's wall and CPU seconds (its own
  process's and its subprocesses') to FILE as JSON lines.

  CPU seconds hardly move with the machine's load, unlike `--durations`: they decide
  which modules are marked slow (contributing's "The quick tier").
  """
  path = os.environ.get('JAXPRUNE_TEST_TIMES')
  if not path:
    yield
    return
  import json
  import resource
  import time

  def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

  wall, used = time.perf_counter(), cpu()
  yield
  record = {
    'test': item.nodeid,
    'wall': round(time.perf_counter() - wall, 3),
    'cpu': round(cpu() - used, 3),
    'slow': item.get_closest_marker('slow') is not None,
  }
  with open(path, 'a') as f:
    f.write(json.dumps(record) + '\n')
