"""What every test file shares.

Test files mirror the package (`transform_test.py` tests `jaxprune/_transform.py`,
`structured_*` the structured stages, `train_*` the main job); models and
references that several files use live beside them (`tiny_models.py`,
`pruning_helpers.py`, `references.py`, `strategies.py`, `structured_zoo.py`,
`thirdparty_zoo.py`), imported by module name.
"""

import getpass
import os
import tempfile

import jax
import pytest
from hypothesis import settings

# One persistent compilation cache for the whole run, shared by the test workers and the
# main jobs they launch (which inherit these variables): dozens of tests compile the same
# small programs. A size limit turns on JAX's lock between processes.
_CACHE = {
    'jax_compilation_cache_dir': os.path.join(
        tempfile.gettempdir(), f'jaxprune-tests-{getpass.getuser()}', 'jax-cache'),
    'jax_persistent_cache_min_compile_time_secs': 0.0,
    'jax_persistent_cache_min_entry_size_bytes': 0,
    'jax_compilation_cache_max_size': 4 << 30,
}
for _name, _value in _CACHE.items():
  os.environ.setdefault(_name.upper(), str(_value))
  jax.config.update(_name, type(_value)(os.environ[_name.upper()]))

# Property tests draw the same examples on every run and machine, and have no
# per-example deadline: the first example of a jitted function compiles.
settings.register_profile('jaxprune', deadline=None, derandomize=True)
settings.load_profile('jaxprune')


@pytest.fixture(scope='module', autouse=True)
def free_compiled_programs():
  """Drops each module's compiled programs from memory when it ends (the persistent
  cache keeps them): a worker runs many modules, and few share their programs."""
  yield
  jax.clear_caches()
