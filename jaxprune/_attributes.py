"""A misspelt public name answered with the nearest one: the namespaces' `__getattr__`.

`jaxprune.sparse.set` raises `AttributeError: module 'jaxprune.sparse' has no attribute
'set'; did you mean jaxprune.sparse.set_?` (PEP 562's module `__getattr__` is called only
for names the module does not have, so a public name costs nothing).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import NoReturn


def no_attribute(module: str, name: str, public: Iterable[str]) -> AttributeError:
  """The AttributeError for `module.name`, suggesting the closest of `public` if any is close."""
  message = f'module {module!r} has no attribute {name!r}'
  if not name.startswith('__'):  # dunders are looked up by tools (copy, doctest), not typed
    close = difflib.get_close_matches(name, sorted(public), n=1)
    if (
      not close
    ):  # a prefix of a longer name: 'rig' for 'rigl', 'prune_with' for 'prune_with_report'
      close = sorted(p for p in public if p.startswith(name) and len(name) >= 3)[:1]
    if close:
      message += f'; did you mean {module}.{close[0]}?'
  return AttributeError(message)


def suggesting_getattr(module: str, public: Iterable[str]) -> Callable[[str], NoReturn]:
  """A module `__getattr__` that raises `no_attribute` for every name it is asked for."""
  names = tuple(public)

  def __getattr__(name: str) -> NoReturn:
    raise no_attribute(module, name, names)

  return __getattr__
