"""The pruning optax transform (SPEC sections 3 and 7).

Chain it after the optimizer:

    tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams))

At a mask update it recomputes thresholds and masks from `params + updates`;
at every step it turns the update of each pruned weight into `-params`, so
after `optax.apply_updates` pruned weights are exactly zero and kept weights
are what the optimizer alone would give (Zhu & Gupta 2017, arXiv:1710.01878).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import Array, lax

from jaxprune import hparams as hparams_lib
from jaxprune import masks as masks_lib
from jaxprune import nm as nm_lib
from jaxprune import schedule
from jaxprune import specs as specs_lib
from jaxprune.names import leaf_name

PyTree = Any
SparsityFn = Callable[[Array], Array]


class PruningState(NamedTuple):
  """The transform's state: a pytree of arrays that jit, shardings and orbax handle.

  Attributes:
    step: int32, the number of updates applied so far.
    last_update_step: int32, the step of the last mask update.
    masks: bool tree parallel to the params (True = kept), None for unpruned leaves.
    thresholds: float32 scalar tree parallel to the params, None for unpruned leaves.
    nonfinite_skips: int32, how many leaf updates were skipped for NaN/Inf weights.
    sparsity: float32, the global target sparsity at the last update call.
  """
  step: Array
  last_update_step: Array
  masks: PyTree
  thresholds: PyTree
  nonfinite_skips: Array
  sparsity: Array


def _check_like_init(state: PruningState, params: PyTree, updates: PyTree) -> None:
  """ValueErrors naming the leaf when params or updates do not match the state's masks."""
  is_none = lambda x: x is None
  masks = jax.tree_util.tree_flatten_with_path(state.masks, is_leaf=is_none)[0]
  for what, tree in (('params', params), ('updates', updates)):
    if jax.tree.structure(tree) != jax.tree.structure(state.masks, is_leaf=is_none):
      raise ValueError(
          f'jaxprune.pruning: the {what} tree has another structure than the params given to '
          f'init: {jax.tree.structure(tree)} vs {jax.tree.structure(state.masks, is_leaf=is_none)}.'
          ' Call init again with the new params.')
    for (path, mask), leaf in zip(masks, jax.tree.leaves(tree), strict=True):
      if mask is not None and mask.shape != leaf.shape:
        raise ValueError(
            f'jaxprune.pruning: {what} leaf {leaf_name(path)!r} has shape {leaf.shape}, but '
            f'its mask from init has shape {mask.shape}. Call init again with the new params.')


def _new_masks(hparams, specs, new_params, state, sparsity_of):
  """Thresholds, masks and the non-finite count after a mask update."""
  spec_list = specs_lib.spec_leaves(specs)
  weights = jax.tree.leaves(new_params)
  old_masks = jax.tree.leaves(state.masks)
  old_thresholds = jax.tree.leaves(state.thresholds)
  pruned = [(i, s) for i, s in enumerate(spec_list) if s is not None]
  new_masks, new_thresholds, skips = list(old_masks), list(old_thresholds), jnp.int32(0)
  method = hparams.threshold_method
  kw = dict(nbins=hparams.nbins, threshold_method=method)

  def finish(j, index, spec, score, current, ok):
    new_thresholds[j], new_masks[j] = masks_lib.finish_update(
        score, current, ok, old_thresholds[j], old_masks[j], weights[index].shape,
        spec.block_dims, hparams.threshold_decay, method)

  magnitude = [(j, i, s) for j, (i, s) in enumerate(pruned) if s.nm is None]
  for j, (index, spec) in enumerate(pruned):
    if spec.nm is not None:
      w = weights[index]
      finite = jnp.all(jnp.isfinite(w))
      skips += (~finite).astype(jnp.int32)
      # The input axis of Dense and conv kernels.
      mask = nm_lib.nm_mask(w, *spec.nm, axis=-2, name=spec.name)
      new_masks[j] = jnp.where(finite, mask, old_masks[j])
  scores = {j: masks_lib.scores(weights[i], s.block_dims, hparams.block_pooling_function)
            for j, i, s in magnitude}
  maxima = {j: masks_lib.max_score(weights[i], scores[j]) for j, i, _ in magnitude}
  for value_max in maxima.values():  # NaN and +-Inf all reach the max: no extra pass
    skips += (~jnp.isfinite(value_max)).astype(jnp.int32)
  if hparams.global_pruning and magnitude:
    value_max = jnp.max(jnp.stack(list(maxima.values())))
    current, ok = masks_lib.threshold_of(list(scores.values()), sparsity_of(None),
                                         value_max=value_max, **kw)
    for j, index, spec in magnitude:
      finish(j, index, spec, scores[j], current, ok)
  else:
    for j, index, spec in magnitude:
      current, ok = masks_lib.threshold_of([scores[j]], sparsity_of(spec),
                                           value_max=maxima[j], **kw)
      finish(j, index, spec, scores[j], current, ok)
  return new_masks, new_thresholds, skips


def _explicit_mesh(arrays: list[Array]) -> Any:
  """The mesh of the first array typed with explicit mesh axes, else None."""
  for array in arrays:
    mesh = getattr(jax.typeof(array).sharding, 'mesh', None)
    if mesh is not None and not mesh.empty and mesh.explicit_axes:
      return mesh
  return None


def _new_masks_on_any_mesh(hparams, specs, new_params, state, sparsity_of):
  """`_new_masks`, also for arrays sharded over explicit mesh axes.

  Explicit axes (the default of `jax.make_mesh`) type every array with its
  sharding, and ops without a sharding rule (the block reshapes) refuse them.
  The mask update runs with automatic axes instead, where XLA's partitioner
  shards it as under `pjit`; masks come back sharded like the old masks,
  thresholds and the count replicated.
  """
  mesh = _explicit_mesh(jax.tree.leaves(new_params))
  if mesh is None:
    return _new_masks(hparams, specs, new_params, state, sparsity_of)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  out_sharding = ([jax.typeof(m).sharding for m in jax.tree.leaves(state.masks)],
                  [replicated for _ in jax.tree.leaves(state.thresholds)], replicated)
  # Values closed over keep their explicit types, so the sparsities come in as arguments.
  keys = [None] + [s for s in specs_lib.spec_leaves(specs) if s is not None]
  sparsities = [sparsity_of(key) for key in keys]

  def compute(new_params, state, sparsities):
    by_spec = dict(zip(keys, sparsities, strict=True))
    return _new_masks(hparams, specs, new_params, state, lambda spec: by_spec[spec])

  return jax.sharding.auto_axes(compute, out_sharding=out_sharding)(new_params, state, sparsities)


def pruning(hparams: ml_collections.ConfigDict | hparams_lib.HParams, *,
            sparsity_fn: SparsityFn | None = None,
            prune_filter: specs_lib.PruneFilter | None = None) -> optax.GradientTransformation:
  """Gradual magnitude pruning with TF `model_pruning` semantics, as an optax transform.

  Args:
    hparams: from `get_pruning_hparams()` / `parse_hparams(...)`; validated and
      parsed once, here.
    sparsity_fn: optional `step -> sparsity` (e.g. an optax schedule) replacing
      the polynomial schedule for every pruned leaf; it cannot be combined with
      `weight_sparsity_map`.
    prune_filter: optional `(name, leaf) -> bool` replacing `weight_name_regex`.

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.
  """
  hparams = hparams_lib.freeze(hparams)
  if sparsity_fn is not None and hparams.sparsity_entries:
    raise ValueError(
        f'weight_sparsity_map={[f"{r}:{v}" for r, v in hparams.sparsity_entries]!r} cannot be '
        'combined with sparsity_fn: per-variable targets follow the polynomial schedule. '
        'Drop one of them.')

  def specs_of(params, warn=False):
    # Specs are rebuilt (from static shapes) at each trace; warn once, at init.
    return specs_lib.leaf_specs(params, hparams, prune_filter, warn=warn)

  def init_fn(params):
    specs = specs_of(params, warn=True)
    leaves, treedef = jax.tree.flatten(params)
    spec_list = specs_lib.spec_leaves(specs)
    for leaf, spec in zip(leaves, spec_list, strict=True):
      if spec is not None and spec.nm is not None:  # a bad N:M shape fails now, not at step one
        jax.eval_shape(lambda w, s=spec: nm_lib.nm_mask(w, *s.nm, axis=-2, name=s.name), leaf)
    masks = [None if s is None else jnp.ones(p.shape, bool)
             for p, s in zip(leaves, spec_list, strict=True)]
    thresholds = [None if s is None else jnp.zeros((), jnp.float32) for s in spec_list]
    return PruningState(
        step=jnp.zeros((), jnp.int32),
        last_update_step=jnp.zeros((), jnp.int32),
        masks=jax.tree.unflatten(treedef, masks),
        thresholds=jax.tree.unflatten(treedef, thresholds),
        nonfinite_skips=jnp.zeros((), jnp.int32),
        sparsity=jnp.zeros((), jnp.float32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('jaxprune.pruning needs the params: call tx.update(grads, state, params).')
    _check_like_init(state, params, updates)
    specs = specs_of(params)
    step = state.step
    global_sparsity = (schedule.sparsity_at(hparams, step) if sparsity_fn is None
                       else jnp.asarray(sparsity_fn(step), jnp.float32))

    def sparsity_of(spec):
      if sparsity_fn is not None or spec is None or spec.target == hparams.target_sparsity:
        return global_sparsity
      return schedule.sparsity_at(hparams, step, target=spec.target)

    do_update = schedule.should_update(hparams, step, state.last_update_step)
    pruned_masks = jax.tree.leaves(state.masks)
    pruned_thresholds = jax.tree.leaves(state.thresholds)

    def recompute(_):
      new_params = optax.apply_updates(params, updates)
      return _new_masks_on_any_mesh(hparams, specs, new_params, state, sparsity_of)

    def keep(_):
      return pruned_masks, pruned_thresholds, jnp.int32(0)

    new_masks, new_thresholds, skips = lax.cond(do_update, recompute, keep, None)
    treedef = jax.tree.structure(state.masks)
    masks = jax.tree.unflatten(treedef, new_masks)
    masked = jax.tree.map(
        lambda mask, u, p: u if mask is None else jnp.where(mask, u, -p).astype(u.dtype),
        masks, updates, params, is_leaf=lambda x: x is None)
    new_state = PruningState(
        step=schedule.next_step(step),
        last_update_step=jnp.where(do_update, step, state.last_update_step),
        masks=masks,
        thresholds=jax.tree.unflatten(jax.tree.structure(state.thresholds), new_thresholds),
        nonfinite_skips=state.nonfinite_skips + skips,
        sparsity=global_sparsity)
    return masked, new_state

  return optax.GradientTransformation(init_fn, update_fn)
