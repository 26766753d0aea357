"""What every test file shares.

Test files mirror the package (`transform_test.py` tests `jaxprune/_transform/transform.py`,
`structured_*` the structured stages, `train_*` the main job); models and
references that several files use live beside them (`tiny_models.py`,
`pruning_helpers.py`, `references.py`, `strategies.py`, `structured_zoo.py`,
`thirdparty_zoo.py`), imported by module name.
"""

import os
import shutil
import tempfile

from hypothesis import settings

# Property tests draw the same examples on every run and machine, and have no
# per-example deadline: the first example of a jitted function compiles.
settings.register_profile('jaxprune', deadline=None, derandomize=True)
settings.load_profile('jaxprune')


_RUN_CACHE = 'JAXPRUNE_TESTS_RUN_CACHE'  # set where this run made the cache below


def pytest_configure(config):
  """One persistent compilation cache for the whole run, its workers and their subprocesses.

  Many tests compile the same steps (the same transform on the same tiny models); each
  compiles once per run. Made before xdist starts its workers, which inherit os.environ;
  a cache given in the environment is kept.
  """
  del config
  if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='jaxprune-tests-jax-cache-')
    os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
    os.environ[_RUN_CACHE] = os.environ['JAX_COMPILATION_CACHE_DIR']


def pytest_unconfigure(config):
  del config
  if 'PYTEST_XDIST_WORKER' not in os.environ and _RUN_CACHE in os.environ:
    shutil.rmtree(os.environ.pop(_RUN_CACHE), ignore_errors=True)
