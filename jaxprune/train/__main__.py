"""`python -m jaxprune.train` runs `jaxprune-train`."""

from jaxprune.train.main import run

run()
