"""One-shot pruning of pytrees: the JAX counterpart of `torch.nn.utils.prune`.

Each function takes a params pytree and returns a *mask tree* parallel to it:
a bool array (True = kept) for each selected leaf and `None` for the others,
the same convention as the optax transform's state. The params are not
changed; `remove(params, masks)` bakes the zeros in (torch's `prune.remove`).

    masks = functional.l1_unstructured(params, amount=0.3, names='Dense_0/kernel')
    masks = functional.ln_structured(params, 0.5, n=2, axis=-1, masks=masks)  # iterative
    params = functional.remove(params, masks)

Semantics follow torch (see `jaxprune.methods`): an int `amount` is a count, a
float a fraction; passing the previous `masks` prunes only what they still keep,
with the amount relative to that, and entries pruned before stay pruned. Methods
rank the params with the previous masks applied (what torch passes: the
current pruned `weight`), or `scores` when given (torch's `importance_scores`,
used as they are). Leaves are selected with `names`, a regex matched with `re.search`
against each leaf's name (`Dense_0/kernel`, see `jaxprune._names`) or a
predicate `(name, leaf) -> bool`.

All functions are pure; with `amount`, `names` and the method fixed they can be
wrapped in `jax.jit` (masks and scores may be traced).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxprune._config import specs as specs
from jaxprune._config.fields import DEFAULT_WEIGHT_NAME_REGEX
from jaxprune._masks.methods import (
  L1Unstructured,
  LnStructured,
  NMStructured,
  PruningMethod,
  RandomUnstructured,
  prune_lowest,
  validate_amount,
)
from jaxprune._names import leaf_name
from jaxprune._results.summaries import apply_masks
from jaxprune._transform.updates import zeroed

PyTree = Any
Names = str | Callable[[str, Any], bool]


def _is_none(x: Any) -> bool:
  return x is None


def _leaves(tree: PyTree, params_def: Any, what: str) -> list[Any]:
  """Leaves of `tree` (None kept as a leaf) in the order of `params_def`."""
  leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_none)
  if treedef != params_def:
    raise ValueError(
      f'{what} must be a tree parallel to params (None for leaves without one); '
      f'got structure {treedef}, params have {params_def}'
    )
  return leaves


class _Flat(NamedTuple):
  """Params, previous masks and scores flattened in the same order."""

  treedef: Any
  names: list[str]
  values: list[Any]
  previous: list[Any]
  scores: list[Any]
  selected: list[int]  # indices of the leaves to prune


def _flatten(params: PyTree, names: Names, masks: PyTree | None, scores: PyTree | None) -> _Flat:
  """Flattens params, masks and scores and selects the leaves `names` picks."""
  flat, params_def = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_none)
  leaf_names = [leaf_name(path) for path, _ in flat]
  values = [leaf for _, leaf in flat]
  previous = [None] * len(values) if masks is None else _leaves(masks, params_def, 'masks')
  score_leaves = values if scores is None else _leaves(scores, params_def, 'scores')
  # A regex names leaves as torch names a parameter: vectors (biases) too.
  wanted = specs.leaf_filter(names, field='names', min_ndim=0)
  selected = [
    i for i, (name, leaf) in enumerate(zip(leaf_names, values, strict=True)) if wanted(name, leaf)
  ]
  if not selected:
    raise ValueError(
      f'names={names!r} selects no leaf; the leaves are {leaf_names}. Pass a regex '
      f'matching some of them (re.search) or a predicate (name, leaf) -> bool'
    )
  for i in selected:
    shape = jnp.shape(values[i])
    if score_leaves[i] is None or jnp.shape(score_leaves[i]) != shape:
      raise ValueError(
        f'scores for leaf {leaf_names[i]!r}: expected an array of shape {shape}, '
        f'got {score_leaves[i]!r:.80}'
      )
    if previous[i] is not None and jnp.shape(previous[i]) != shape:
      raise ValueError(
        f'masks for leaf {leaf_names[i]!r}: expected shape {shape}, got '
        f'{jnp.shape(previous[i])}; pass the mask tree returned for these params'
      )
  return _Flat(params_def, leaf_names, values, previous, score_leaves, selected)


def _previous_mask(mask: jax.Array | None, shape: tuple[int, ...]) -> jax.Array:
  return jnp.ones(shape, bool) if mask is None else jnp.asarray(mask, bool)


def _prune_each(
  params: PyTree,
  names: Names,
  masks: PyTree | None,
  scores: PyTree | None,
  method_for: Callable[[int], PruningMethod],
) -> PyTree:
  """Applies `method_for(leaf_index)` to every selected leaf, keeping the others' masks."""
  flat = _flatten(params, names, masks, scores)
  new_masks = list(flat.previous)
  for i in flat.selected:
    value = jnp.asarray(flat.values[i])
    prev = _previous_mask(flat.previous[i], value.shape)
    if scores is None:
      weights = zeroed(prev, value)
    else:
      weights = jnp.asarray(flat.scores[i])
    try:
      mask = method_for(i).compute_mask(weights, prev)
    except ValueError as e:
      raise ValueError(f'leaf {flat.names[i]!r}: {e}') from e
    if jnp.shape(mask) != value.shape:
      raise ValueError(
        f'compute_mask returned shape {jnp.shape(mask)} for leaf {flat.names[i]!r} of '
        f"shape {value.shape}; it must return a mask of the leaf's shape"
      )
    new_masks[i] = prev & jnp.asarray(mask, bool)
  return jax.tree_util.tree_unflatten(flat.treedef, new_masks)


def prune(
  params: PyTree,
  method: PruningMethod,
  *,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
  scores: PyTree | None = None,
) -> PyTree:
  """Prunes each selected leaf with a method (torch's `BasePruningMethod.apply`).

  Args:
    params: a pytree of arrays.
    method: any object with `compute_mask(weights, previous_mask) -> bool mask`
      (see `jaxprune.methods.PruningMethod`); it sees the leaf's values with
      the previous mask applied (or its `scores`) and the previous mask (all
      True if none), and its result is ANDed with the previous mask.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call, to prune iteratively.
    scores: optional tree parallel to params used instead of the values
      (torch's `importance_scores`).

  Returns:
    The mask tree: bool for selected leaves and for leaves masked before,
    None elsewhere.
  """
  if not isinstance(method, PruningMethod):
    raise TypeError(
      f'method={method!r}: expected an object with a compute_mask(weights, previous_mask) method'
    )
  return _prune_each(params, names, masks, scores, lambda i: method)


def l1_unstructured(
  params: PyTree,
  amount: int | float,
  *,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
  scores: PyTree | None = None,
) -> PyTree:
  """Prunes the `amount` smallest-magnitude entries of each selected leaf.

  Args:
    params: a pytree of arrays.
    amount: int count or float fraction (of the still-unpruned entries) per leaf.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call, to prune iteratively.
    scores: optional importance tree used instead of the params' values.

  Returns:
    The mask tree (None for leaves neither selected nor masked before).
  """
  return prune(params, L1Unstructured(amount), names=names, masks=masks, scores=scores)


def random_unstructured(
  params: PyTree,
  amount: int | float,
  *,
  key: jax.Array,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
) -> PyTree:
  """Prunes `amount` uniformly random entries of each selected leaf.

  Args:
    params: a pytree of arrays.
    amount: int count or float fraction (of the still-unpruned entries) per leaf.
    key: a PRNG key; leaf `i` (in flattening order) uses `fold_in(key, i)`.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call, to prune iteratively.

  Returns:
    The mask tree (None for leaves neither selected nor masked before).
  """
  validate_amount(amount)
  return _prune_each(
    params, names, masks, None, lambda i: RandomUnstructured(amount, jax.random.fold_in(key, i))
  )


def ln_structured(
  params: PyTree,
  amount: int | float,
  n: float,
  axis: int,
  *,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
  scores: PyTree | None = None,
) -> PyTree:
  """Prunes whole slices along `axis` with the smallest Ln norm (torch's `ln_structured`).

  For a Dense kernel `(in, out)`, `axis=-1` removes output units and `axis=0`
  input features; for a conv kernel `(H, W, in, out)`, `axis=-1` removes
  filters (torch's `dim=0`, since torch stores `(out, in, H, W)`).

  Args:
    params: a pytree of arrays.
    amount: int count or float fraction of the still-unpruned slices per leaf.
    n: the norm order: 1, 2, ... or `float('inf')`.
    axis: the axis whose slices are pruned.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call, to prune iteratively.
    scores: optional importance tree used instead of the params' values.

  Returns:
    The mask tree (None for leaves neither selected nor masked before).
  """
  return prune(params, LnStructured(amount, n, axis), names=names, masks=masks, scores=scores)


def nm_structured(
  params: PyTree,
  n: int,
  m: int,
  axis: int = -2,
  *,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
) -> PyTree:
  """Keeps the `n` largest-magnitude of every `m` consecutive entries along `axis`.

  The N:M pattern of tfmot's `sparsity_m_by_n` (2:4 for sparse tensor cores);
  the default axis -2 is the input-channel axis of Dense `(in, out)` and conv
  `(H, W, in, out)` kernels. See `jaxprune.nm_mask`.

  Args:
    params: a pytree of arrays.
    n: entries kept per group.
    m: group size; each selected leaf's `axis` must be divisible by it.
    axis: the grouping axis.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call; entries pruned before stay pruned.

  Returns:
    The mask tree (None for leaves neither selected nor masked before).
  """
  return prune(params, NMStructured(n, m, axis), names=names, masks=masks)


def global_unstructured(
  params: PyTree,
  amount: int | float,
  *,
  names: Names = DEFAULT_WEIGHT_NAME_REGEX,
  masks: PyTree | None = None,
  scores: PyTree | None = None,
) -> PyTree:
  """Prunes the `amount` smallest-magnitude entries across all selected leaves together.

  torch's `global_unstructured` with `L1Unstructured`: one ranking over the
  concatenation of the selected leaves (in flattening order), so leaves end up
  with different sparsities. Ties go to the leaf earlier in flattening order,
  then to the lower index. For random global pruning pass random `scores`.

  Args:
    params: a pytree of arrays.
    amount: int count or float fraction of all still-unpruned selected entries.
    names: regex (re.search on the leaf name) or predicate selecting leaves.
    masks: the mask tree of an earlier call, to prune iteratively.
    scores: optional importance tree used instead of the params' values.

  Returns:
    The mask tree (None for leaves neither selected nor masked before).
  """
  validate_amount(amount)
  flat = _flatten(params, names, masks, scores)
  shapes = [jnp.shape(flat.values[i]) for i in flat.selected]
  flat_scores = jnp.concatenate(
    [jnp.abs(jnp.asarray(flat.scores[i])).reshape(-1) for i in flat.selected]
  )
  flat_previous = jnp.concatenate(
    [
      _previous_mask(flat.previous[i], shape).reshape(-1)
      for i, shape in zip(flat.selected, shapes, strict=True)
    ]
  )
  keep = prune_lowest(flat_scores, amount, flat_previous)
  new_masks = list(flat.previous)
  offset = 0
  for i, shape in zip(flat.selected, shapes, strict=True):
    size = math.prod(shape)
    new_masks[i] = keep[offset : offset + size].reshape(shape)
    offset += size
  return jax.tree_util.tree_unflatten(flat.treedef, new_masks)


def remove(params: PyTree, masks: PyTree) -> PyTree:
  """Bakes the masks into the params: pruned entries become 0, masks are dropped.

  torch's `prune.remove`; the same as `jaxprune.apply_masks` and `export.strip`.

  Args:
    params: a pytree of arrays.
    masks: a mask tree (None for unpruned leaves), a `PruningState`, or an
      optax state containing one.

  Returns:
    params with every masked-out entry set to zero (same dtypes).

  Raises:
    ValueError: if a mask's shape differs from its leaf's (masks are not
      broadcast) or the trees are not parallel.
  """
  return apply_masks(params, masks)
