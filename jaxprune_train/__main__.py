"""`python -m jaxprune_train` runs `jaxprune-train`."""

from jaxprune_train._entry import run

run()
