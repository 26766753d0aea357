"""Warnings attributed to the user's line.

`warnings.warn`'s `stacklevel` counts frames, and how many lie between the user's call and
the code that warns depends on the path: the keyword or the chained form, optax's chain,
a step being traced by `jax.jit`, JAX calling back into jaxprune (`jax.tree.map`). A
count written at each call pointed at jaxprune's or optax's own lines on some of those
paths. `warn` counts them instead: the warning goes to the first frame outside jaxprune,
optax and JAX, which is where the user called the library (or the user's function that
JAX is tracing). Python 3.12's `skip_file_prefixes` does the same; jaxprune supports
3.10.
"""

from __future__ import annotations

import os
import sys
import warnings

import jax
import optax

_LIBRARIES = tuple(
  os.path.dirname(os.path.abspath(module.__file__)) + os.sep
  for module in (sys.modules[__package__], optax, jax)
)


def user_stacklevel() -> int:
  """The `stacklevel` that a `warnings.warn` called by this function's caller needs to
  point at the first frame outside jaxprune, optax and JAX."""
  frame, level = sys._getframe(1), 1
  while frame is not None and (
    frame.f_code.co_filename.startswith(_LIBRARIES)
    or frame.f_code.co_filename == '<string>'  # a dataclass's generated __init__
  ):
    frame, level = frame.f_back, level + 1
  return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
  """`warnings.warn(message, category)`, attributed to the user's line (see the module)."""
  warnings.warn(message, category, stacklevel=user_stacklevel())
