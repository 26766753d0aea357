"""`python -m jaxprune.train` runs `jaxprune-train`.

Ctrl-C has the job's line already: `jaxprune/__init__.py`, which Python imports before this
module, put it in place first (`_jaxprune_train.guard_module_run`).
"""

from jaxprune.train._main import run

run()
