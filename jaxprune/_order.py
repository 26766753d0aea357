"""Whether a jaxprune transform stands last in an optax chain, as it must.

docs/explanation/semantics.md#order-in-an-optax-chain: the transforms' `-params` updates
must reach `optax.apply_updates` unchanged for pruned weights to land on zero, so a
transform chained after `pruning` or `pruned` (most often the optimizer, placed after
pruning) undoes the pruning. `warn_if_followed_in_a_chain` says so while the step is
traced, before it first runs; `any_moved`, run at each mask update, finds what the
stack cannot show and feeds `PruningState.moved_updates`, which the accessors warn on.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import Array

_OPTAX_DIR = os.path.dirname(optax.__file__) + os.sep
ORDER_FIX = (
  'Put pruning last: optax.chain(optax.adam(lr), jaxprune.pruning(hp)), or use '
  'jaxprune.pruned(optax.adam(lr), hp).'
)


def warn_if_followed_in_a_chain(what: str) -> None:
  """Warns, while the step is traced, when an `optax.chain` or `optax.named_chain` runs
  another transform after this one: it changes the updates that set pruned weights to
  exactly zero (the usual case: the optimizer placed after `pruning`, which then trains
  the pruned weights again). The check reads the chain's loop from the Python stack
  (optax's frames only), so it costs nothing in the compiled step; a step that holds a
  host callback instead would cost every call. Where the stack does not show a chain,
  nothing is said here, and the accessors still warn about moved weights."""
  try:
    level = _followed_at(sys._getframe(2), 3)  # from the frame of the caller of `update_fn`
  except Exception:  # another optax or Python: the check must never stop a step
    return
  if level is not None:
    warnings.warn(
      f'{what} is followed by another transform in an optax chain, which changes its '
      'updates: the pruned weights will not land on zero (an optimizer placed after it '
      f'trains them again). {ORDER_FIX}',
      UserWarning,
      stacklevel=level,
    )


def _followed_at(frame: Any, level: int) -> int | None:
  """The user's `stacklevel` when a chain among optax's frames from `frame` (at `level`)
  up runs a transform after the current one, else None."""
  while frame is not None and frame.f_code.co_filename.startswith(_OPTAX_DIR):
    local = frame.f_locals if frame.f_code.co_name == 'update_fn' else {}
    fns, transforms = local.get('update_fns'), local.get('transforms')  # chain, named_chain
    if (fns and local.get('fn') is not fns[-1]) or (
      transforms and 'name' in local and local['name'] != transforms[-1][0]
    ):
      return _user_level(frame, level)
    frame, level = frame.f_back, level + 1
  return None


_LIBRARIES = tuple(
  os.path.dirname(module.__file__) + os.sep for module in (optax, jax, sys.modules[__package__])
)


def _user_level(frame: Any, level: int) -> int:
  """The `stacklevel` of the first frame above `frame` (at `level`) outside optax, jax and
  jaxprune: the user's line that calls the step."""
  while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
    frame, level = frame.f_back, level + 1
  return level


def any_moved(masks: list[Array], params: list[Array]) -> Array:
  """Whether a pruned entry of `params` is nonzero (NaN aside): each step leaves the
  entries its masks prune at exactly zero, so at the next step they still are
  unless something after the transform changed them."""
  moved = [jnp.any(~mask & (p != 0) & ~jnp.isnan(p)) for mask, p in zip(masks, params, strict=True)]
  return functools.reduce(jnp.logical_or, moved, jnp.bool_(False))
