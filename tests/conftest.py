"""What every test file shares.

Test files mirror the package (`transform_test.py` tests `jaxprune/_transform.py`,
`structured_*` the structured stages, `train_*` the main job); models and
references that several files use live beside them (`tiny_models.py`,
`pruning_helpers.py`, `references.py`, `strategies.py`, `structured_zoo.py`,
`thirdparty_zoo.py`), imported by module name.
"""

from hypothesis import settings

# Property tests draw the same examples on every run and machine, and have no
# per-example deadline: the first example of a jitted function compiles.
settings.register_profile('jaxprune', deadline=None, derandomize=True)
settings.load_profile('jaxprune')

