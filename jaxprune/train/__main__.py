"""`python -m jaxprune.train` runs `jaxprune-train`."""

from jaxprune.train._main import run

run()
