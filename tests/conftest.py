"""What every test file shares.

Test files mirror the package (`transform_test.py` tests `jaxprune/_transform.py`,
`structured_*` the structured stages, `train_*` the main job); models and
references that several files use live beside them (`tiny_models.py`,
`pruning_helpers.py`, `references.py`, `strategies.py`, `structured_zoo.py`,
`thirdparty_zoo.py`), imported by module name.
"""

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run and machine, and have no
# per-example deadline: the first example of a jitted function compiles.
settings.register_profile('jaxprune', deadline=None, derandomize=True)
settings.load_profile('jaxprune')


@pytest.fixture(scope='module')
def subprocess_compilation_cache(tmp_path_factory):
  """One persistent compilation cache for the subprocesses a module starts (they inherit
  os.environ): every run after the first finds the steps an earlier one compiled."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path_factory.mktemp('jax_cache')))
    patch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
    yield
