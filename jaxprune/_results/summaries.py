"""TF's accessors: masks, thresholds, sparsities and a flat summary dict.

See docs/explanation/semantics.md#reports.

Each accessor takes the `PruningState` or any optax state that holds exactly
one (a state without one is a ValueError), and returns one of two shapes, by
what its values are for:

- `get_masks` returns the state's mask tree, parallel to the params (None for
  unpruned leaves), because masks are applied to params: `apply_masks`,
  `export.strip`, `structured.select(masks=...)`.
- The reports (`get_thresholds`, `get_weight_sparsity`, `count_nonfinite`,
  `summaries`) return flat dicts keyed by leaf name ('Dense_0/kernel'), the
  names `jaxprune.named_leaves` gives, ready to log.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax import Array

from jaxprune import _warnings as warnings_lib
from jaxprune._config.hparams import HParams
from jaxprune._names import leaf_name
from jaxprune._results import shortfall as shortfall
from jaxprune._transform import updates as updates_lib
from jaxprune._transform.order import ORDER_FIX
from jaxprune._transform.transform import PruningState

PyTree = Any


def _is_state(x: Any) -> bool:
  return isinstance(x, PruningState)


def find_state(state: Any, kinds: type | tuple[type, ...], what: str, when_none: str) -> Any:
  """The one state of type `kinds` inside an optax state (or the state itself).

  The one search of jaxprune's accessors: `find_pruning_state` and
  `jaxprune.sparse.find_state` call it.

  Args:
    state: an optax state (any pytree holding states) or the state itself.
    kinds: the state's type, or a tuple of types.
    what: the state in words, for the errors, e.g. 'jaxprune PruningState'.
    when_none: the way out when there is none, for the error.

  Raises:
    ValueError: when there is none, or several (pass the one you mean).
  """

  def is_kind(x):
    return isinstance(x, kinds)

  found = [x for x in jax.tree.leaves(state, is_leaf=is_kind) if is_kind(x)]
  if len(found) == 1:
    return found[0]
  if not found:
    raise ValueError(f'expected exactly one {what} in the optimizer state, found 0: {when_none}')
  raise ValueError(
    f'expected exactly one {what} in the optimizer state, found {len(found)}; pass the '
    f'{what} itself.'
  )


def find_pruning_state(state: Any) -> PruningState:
  """Returns the PruningState inside an optax state (or the state itself).

  Raises:
    ValueError: when there is none (the state of an optimizer without
      `jaxprune.pruning`), or several (pass the one you mean).
  """
  return find_state(
    state,
    PruningState,
    'jaxprune PruningState',
    'pass the state of optax.chain(optimizer, jaxprune.pruning(hparams)) (its '
    'tx.init(params)), or the PruningState itself.',
  )


MOVED_ADVICE = (
  'the params are not as sparse as the masks say. Is jaxprune.pruning placed before the '
  'optimizer, as in optax.chain(jaxprune.pruning(hp), optax.adam(lr))? The optimizer '
  f'then trains the pruned weights again. {ORDER_FIX} (Params changed outside the '
  'optimizer step have the same effect.)'
)


def _checked(state: Any) -> PruningState:
  """`find_pruning_state(state)`, warning when its mask updates found pruned weights
  moved (`PruningState.moved_updates`): the masks then describe params that are not
  pruned. Quiet under `jit`, where the count is not known yet."""
  state = find_pruning_state(state)
  try:
    moved = int(state.moved_updates)
  except (TypeError, RuntimeError):  # a tracer, or not addressable from this process
    return state
  if moved:
    warnings_lib.warn(
      f'jaxprune: {moved} mask update(s) found pruned weights that were no longer zero, so '
      + MOVED_ADVICE,
    )
  return state


def _is_named_tuple(x: Any) -> bool:
  return isinstance(x, tuple) and hasattr(x, '_fields')


def _is_optimizer_state(tree: Any) -> bool:
  """Whether `tree` holds optax states (NamedTuples such as ScaleByAdamState) rather than params."""
  return any(_is_named_tuple(x) for x in jax.tree.leaves(tree, is_leaf=_is_named_tuple))


def contains_pruning_state(state: Any) -> bool:
  """Whether `state` is or holds a PruningState."""
  return any(_is_state(x) for x in jax.tree.leaves(state, is_leaf=_is_state))


def _named(tree: PyTree) -> dict[str, Any]:
  """{name: leaf} of the non-None leaves of a mask or threshold tree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {leaf_name(path): leaf for path, leaf in flat}


def get_masks(state: Any) -> PyTree:
  """The masks of a pruning state, as a tree.

  Args:
    state: a PruningState or an optax state that holds one.

  Returns:
    The bool mask tree (True = kept), parallel to the params, None for
    unpruned leaves: what `apply_masks(params, masks)` takes.

  Example:
    >>> import jax.numpy as jnp, optax, jaxprune
    >>> tx = jaxprune.pruning('target_sparsity=0.5')
    >>> state = tx.init({'Dense_0': {'kernel': jnp.ones((2, 3)), 'bias': jnp.ones(3)}})
    >>> jaxprune.get_masks(state)  # all kept before the first mask update; None: not pruned
    {'Dense_0': {'bias': None, 'kernel': Array([[ True,  True,  True],
           [ True,  True,  True]], dtype=bool)}}
  """
  return _checked(state).masks


def get_thresholds(state: Any) -> dict[str, Array]:
  """The thresholds of a pruning state, by leaf name.

  Args:
    state: a PruningState or an optax state that holds one.

  Returns:
    {leaf name: float32 threshold} for each pruned leaf: a scalar, or one per
    layer of a leaf with layer axes (`layer_axes_map`). With a mask rule
    (`mask_rule=`), the rule's own names (channel groups for `ChannelRule`).
  """
  return _named(_checked(state).thresholds)


def _fraction(flags: Array) -> Array:
  # sum / size rather than mean: 60 of 100 reads 0.6, not 0.59999996.
  return jnp.sum(flags, dtype=jnp.int32).astype(jnp.float32) / jnp.float32(flags.size)


def get_weight_sparsity(state_or_params: Any) -> dict[str, Array]:
  """The fraction of each weight's entries that are zero, by leaf name.

  Given a pruning state, the zeros the masks put in the params (the entries
  they prune: after `optax.apply_updates` these are exactly the zeros of the
  pruned weights); given params, the zeros they hold. A NaN is never counted
  as a zero; see `count_nonfinite`.

  Args:
    state_or_params: a PruningState or an optax state that holds one; or a
      params tree (dicts, Flax `variables['params']`, an NNX state).

  Returns:
    {leaf name: float32 fraction}: for a state each pruned leaf, for params
    each leaf of 2 or more axes.

  Raises:
    ValueError: for an optax state without a PruningState (its moments are
      not weights), or with several.

  Example:
    >>> import jax.numpy as jnp, jaxprune
    >>> params = {'Dense_0': {'kernel': jnp.array([[0., 1.], [0., 0.]]), 'bias': jnp.zeros(2)}}
    >>> jaxprune.get_weight_sparsity(params)  # pruned leaves only (default regex)
    {'Dense_0/kernel': Array(0.75, dtype=float32)}
  """
  if contains_pruning_state(state_or_params) or _is_optimizer_state(state_or_params):
    masks = _named(_checked(state_or_params).masks)
    return {name: _fraction(~mask) for name, mask in masks.items()}
  return {
    name: _fraction(leaf == 0)
    for name, leaf in _named(state_or_params).items()
    if getattr(leaf, 'ndim', 0) >= 2
  }


def count_nonfinite(params: PyTree) -> dict[str, Array]:
  """{leaf name: int32 count of NaN/Inf entries} for each leaf with ndim >= 2."""
  return {
    name: jnp.sum(~jnp.isfinite(leaf), dtype=jnp.int32)
    for name, leaf in _named(params).items()
    if getattr(leaf, 'ndim', 0) >= 2
  }


def apply_masks(params: PyTree, state: Any) -> PyTree:
  """Zeroes the pruned entries of `params` (unpruned leaves pass through).

  The one mask-zeroing rule of jaxprune: `export.strip` and
  `functional.remove` call it. Jittable (the masks may be traced).

  Args:
    params: a pytree of arrays.
    state: a `PruningState`, an optax state containing one, or a mask tree
      parallel to `params` (bool, True = kept; None for unpruned leaves).

  Returns:
    `params` with zeros where the masks are False, same shapes and dtypes.

  Raises:
    ValueError: if the masks are not a tree parallel to `params`, or a mask's
      shape differs from its leaf's (a mask is never broadcast), naming the leaf.
  """
  holds_state = contains_pruning_state(state) or _is_optimizer_state(state)
  masks = get_masks(state) if holds_state else state
  is_none = lambda x: x is None  # None marks a leaf without a mask
  flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_none)
  mask_leaves, mask_treedef = jax.tree_util.tree_flatten(masks, is_leaf=is_none)
  if mask_treedef != treedef:
    raise ValueError(
      'masks must be a tree parallel to params (None for unpruned leaves), a PruningState, '
      f'or an optax state containing one; got structure {mask_treedef}, params have {treedef}'
    )
  zeroed = []
  for (path, leaf), mask in zip(flat, mask_leaves, strict=True):
    if mask is None:
      zeroed.append(leaf)
      continue
    if jnp.shape(mask) != jnp.shape(leaf):
      raise ValueError(
        f'the mask of leaf {leaf_name(path)!r} has shape {jnp.shape(mask)} but the leaf has '
        f"shape {jnp.shape(leaf)}; masks are not broadcast: give the leaf's shape"
      )
    zeroed.append(updates_lib.zeroed(mask, leaf))
  return jax.tree_util.tree_unflatten(treedef, zeroed)


def summaries(
  state: Any, hparams: ml_collections.ConfigDict | HParams | None = None
) -> dict[str, Array]:
  """The scalars TF wrote as summaries, as a flat dict.

  Keys: '<name>/sparsity' (the target at the last step), '<name>/last_mask_update_step',
  '<name>/nonfinite_skips', '<name>/moved_updates' (see `PruningState`; the
  accessors warn when it is not 0), and '<leaf>/sparsity', '<leaf>/threshold' per pruned
  leaf, with <name> = hparams.name (default 'model_pruning'); with a mask rule,
  '<key>/threshold' for each key of its thresholds (channel groups).

  Example:
    >>> import jax.numpy as jnp, jaxprune
    >>> hp = jaxprune.parse_hparams('target_sparsity=0.8')
    >>> state = jaxprune.pruning(hp).init({'Dense_0': {'kernel': jnp.ones((4, 4))}})
    >>> for name, value in jaxprune.summaries(state, hp).items():
    ...   print(name, float(value))
    model_pruning/sparsity 0.0
    model_pruning/last_mask_update_step 0.0
    model_pruning/nonfinite_skips 0.0
    model_pruning/moved_updates 0.0
    Dense_0/kernel/sparsity 0.0
    Dense_0/kernel/threshold 0.0
  """
  state = _checked(state)
  prefix = 'model_pruning' if hparams is None else hparams.name
  out = {
    f'{prefix}/sparsity': state.sparsity,
    f'{prefix}/last_mask_update_step': state.last_update_step,
    f'{prefix}/nonfinite_skips': state.nonfinite_skips,
    f'{prefix}/moved_updates': state.moved_updates,
  }
  thresholds = _named(state.thresholds)
  for name, mask in _named(state.masks).items():
    out[f'{name}/sparsity'] = _fraction(~mask)
    if name in thresholds:
      out[f'{name}/threshold'] = thresholds.pop(name)
  # A mask rule's thresholds need not be per leaf (channel groups).
  for name, threshold in thresholds.items():
    out[f'{name}/threshold'] = threshold
  shortfall.warn_short(state, hparams, _named(state.masks), _named(state.thresholds))
  return out
