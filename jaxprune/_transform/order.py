"""Whether a jaxprune transform stands last in an optax chain, read from optax's frames.

docs/explanation/semantics.md#order-in-an-optax-chain: the transforms' `-params` updates
must reach `optax.apply_updates` unchanged for pruned weights to land on zero, so a
transform chained after `pruning` or `pruned` (most often the optimizer, placed after
pruning) undoes the pruning. `warn_if_followed_in_a_chain` says so while the step is
traced, before it first runs. (`jaxprune._transform.moved.any_moved`, at each mask update, finds
what the stack cannot show.)

Why read optax's private state: a chain's transforms do not know their neighbours, and
optax offers no way to ask which transform runs after the current one. The Python stack
holds the answer for free: while `optax.chain`'s (or `optax.named_chain`'s) `update_fn`
runs its loop, its frame's local variables are the loop's. A check inside the compiled
step (a host callback) would cost every call; this one costs nothing there. The names
read are optax's private details, checked against optax 0.2.8 and 0.2.5
(`transforms/_combining.py`; tests/order_optax_frames_test.py reads them):

- `optax.chain`'s `update_fn(updates, state, params=None, **extra_args)` loops
  `for s, fn in zip(state, update_fns)`: locals `update_fns`, `fn`, `s`, `state`,
  `updates`, `params`, `extra_args`;
- `optax.named_chain`'s loops `for name, tx in transforms` over `(name, transform)`
  pairs: locals `transforms`, `name`, `state` (by name), `updates`, `params`,
  `extra_args`.

If another optax names them otherwise, nothing is found and nothing is said (the
accessors still warn about moved weights); if it names them alike but holds other
values, the KeyError, IndexError, TypeError, ValueError or AttributeError that reading
them raises is caught, and only those: JAX's tracing errors are TypeErrors and
IndexErrors too, so a later transform that cannot be traced on abstract values counts as
a change, and any other error is a bug that should be seen.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxprune import _warnings as warnings_lib

_OPTAX_DIR = os.path.dirname(optax.__file__) + os.sep
# What reading another optax's locals, or tracing a later transform on abstract values
# (jax.errors' tracing errors subclass TypeError and IndexError), can raise.
_READING_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)
ORDER_FIX = (
  'Put pruning last: optax.chain(optax.adam(lr), jaxprune.pruning(hp)), or use '
  'jaxprune.pruned(optax.adam(lr), hp).'
)


def warn_if_followed_in_a_chain(what: str) -> None:
  """Warns, while the step is traced, when an `optax.chain` or `optax.named_chain` runs
  another transform after this one that changes the updates that set pruned weights to
  exactly zero (the usual case: the optimizer placed after `pruning`, which then trains
  the pruned weights again). The check reads the chain's loop from the Python stack
  (optax's frames only), so it costs nothing in the compiled step; a step that holds a
  host callback instead would cost every call. Where the stack does not show a chain,
  nothing is said here, and the accessors still warn about moved weights."""
  try:
    followed = _followed(sys._getframe(2))  # from the frame of the caller of `update_fn`
  except _READING_ERRORS:  # another optax's locals of other kinds: no warning
    return
  if followed:
    warnings_lib.warn(
      f'{what} is followed by another transform in an optax chain, which changes its '
      'updates: the pruned weights will not land on zero (an optimizer placed after it '
      f'trains them again). {ORDER_FIX}'
    )


def _followed(frame: Any) -> bool:
  """Whether a chain among optax's frames from `frame` up runs a transform after the
  current one that changes the updates of its pruned weights."""
  while frame is not None and frame.f_code.co_filename.startswith(_OPTAX_DIR):
    local = frame.f_locals if frame.f_code.co_name == 'update_fn' else {}
    fns, transforms = local.get('update_fns'), local.get('transforms')  # chain, named_chain
    if (fns and local.get('fn') is not fns[-1]) or (
      transforms and 'name' in local and local['name'] != transforms[-1][0]
    ):
      if _changes_pruned_updates(local):
        return True
    frame = frame.f_back
  return False


def _changes_pruned_updates(chain: dict[str, Any]) -> bool:
  """Whether the transforms after the current one in a chain's loop (its frame's locals)
  change the updates of the weights the current one prunes: they do unless, traced once
  more on abstract values, each such update comes out as the very value that went in
  (`optax.identity()`, a `pruning` of other leaves). Anything that cannot be read so
  counts as a change."""
  try:
    current, later = _current_and_later(chain)
    pruned = _pruned_positions(current)
    if pruned is None:
      return True
    extra = chain.get('extra_args', {})

    def run(updates, states, params, extra):
      for (update, _), state in zip(later, states, strict=True):
        updates, _ = update(updates, state, params, **extra)
      return updates

    abstract = [_abstract(chain['updates']), _abstract([s for _, s in later])]
    closed = jax.make_jaxpr(run)(*abstract, _abstract(chain['params']), _abstract(extra))
    inputs, outputs = closed.jaxpr.invars, closed.jaxpr.outvars
    return any(outputs[i] is not inputs[i] for i in pruned)
  except _READING_ERRORS:  # another optax's locals, or a transform JAX cannot trace here
    return True


def _current_and_later(chain: dict[str, Any]) -> tuple[Any, list[tuple[Any, Any]]]:
  """The current transform's state, and (update function, state) of each one after it."""
  state = chain['state']
  if 'update_fns' in chain:  # optax.chain: `for s, fn in zip(state, update_fns)`
    fns = chain['update_fns']
    (i,) = [k for k, fn in enumerate(fns) if fn is chain['fn'] and state[k] is chain['s']]
    return state[i], list(zip(fns[i + 1 :], state[i + 1 :], strict=True))
  names = [name for name, _ in chain['transforms']]  # optax.named_chain
  i = names.index(chain['name'])
  later = [(tx.update, state[name]) for name, tx in chain['transforms'][i + 1 :]]
  return state[chain['name']], later


def _is_pruning_state(x: Any) -> bool:
  return hasattr(x, 'masks') and hasattr(x, 'moved_updates')  # a PruningState


def _pruned_positions(state: Any) -> set[int] | None:
  """Positions, in the params' flattening order, of the leaves the PruningStates in
  `state` mask (`pruned` holds one beside its optimizer's); None when it holds none."""
  found = [x for x in jax.tree.leaves(state, is_leaf=_is_pruning_state) if _is_pruning_state(x)]
  if not found:
    return None
  masks = [jax.tree.leaves(s.masks, is_leaf=lambda m: m is None) for s in found]
  return {i for leaves in masks for i, mask in enumerate(leaves) if mask is not None}


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)
