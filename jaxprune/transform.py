"""The pruning optax transform (SPEC sections 3 and 7).

Chain it after the optimizer:

    tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams))

At a mask update it recomputes thresholds and masks from `params + updates`;
at every step it turns the update of each pruned weight into `-params`, so
after `optax.apply_updates` pruned weights are exactly zero and kept weights
are what the optimizer alone would give (Zhu & Gupta 2017, arXiv:1710.01878).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import Array, lax

from jaxprune import counting, schedule
from jaxprune import hparams as hparams_lib
from jaxprune import masks as masks_lib
from jaxprune import nm as nm_lib
from jaxprune import specs as specs_lib
from jaxprune.names import leaf_name

PyTree = Any
SparsityFn = Callable[[Array], Array]


class MaskRule(Protocol):
  """Computes the masks of the pruned leaves in place of the per-leaf magnitude rule.

  `pruning(hparams, mask_rule=rule)` keeps its schedule, gating, application
  of the masks and state, and hands the choice of the pruned leaves and the
  mask updates to the rule (`jaxprune.channels.ChannelRule` masks whole
  coupled channels).
  """

  def check(self, hparams: hparams_lib.HParams) -> None:
    """Raises ValueError for hparams the rule cannot honour (at `pruning(...)`)."""

  def init(self, params: PyTree) -> tuple[PyTree, PyTree]:
    """(masks, thresholds): masks a bool tree parallel to `params`, None for leaves it
    leaves alone; thresholds any pytree of float32 arrays."""

  def new_masks(self, hparams: hparams_lib.HParams, weights: list[Callable[[Any], Array]],
                old_masks: list[Array], thresholds: PyTree, sparsity: Array
                ) -> tuple[list[Array], PyTree, Array]:
    """At a mask update, inside jit: (masks, thresholds, int32 count of skipped units).

    `weights` are the pruned leaves' values as callables of a token (see
    `masks.Variable`), `old_masks` their masks, both in the params' order;
    `sparsity` is the schedule's (or `sparsity_fn`'s) value at this step.
    """


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


def _as_stored(values: Array, dtype: Any) -> Array:
  """`values` rounded to `dtype`, the way optax.apply_updates stores them.

  XLA drops a round trip through a narrower float (f32 -> bf16 -> f32) as
  "excess precision"; reduce_precision is the rounding it keeps.
  """
  info = jnp.finfo(dtype)
  if info.bits < jnp.finfo(values.dtype).bits:
    values = lax.reduce_precision(values, exponent_bits=info.nexp, mantissa_bits=info.nmant)
  return values.astype(dtype)


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


def _new_masks(hparams, specs, weights, state, sparsity_of):
  """Thresholds, masks and the non-finite count after a mask update.

  `weights` are the pruned leaves' values as callables (made where they are
  read), in the order of the pruned specs.
  """
  specs = [s for s in specs_lib.spec_leaves(specs) if s is not None]
  old_masks = jax.tree.leaves(state.masks)
  old_thresholds = jax.tree.leaves(state.thresholds)
  new_masks, new_thresholds, skips = list(old_masks), list(old_thresholds), jnp.int32(0)
  magnitude = [j for j, spec in enumerate(specs) if spec.nm is None]
  for j, spec in enumerate(specs):
    if spec.nm is not None:
      w = weights[j](None)
      finite = jnp.all(jnp.isfinite(w))
      skips += (~finite).astype(jnp.int32)
      # The input axis of Dense and conv kernels.
      mask = nm_lib.nm_mask(w, *spec.nm, axis=-2, name=spec.name)
      new_masks[j] = jnp.where(finite, mask, old_masks[j])
  if not magnitude:
    return new_masks, new_thresholds, skips
  variables = [masks_lib.Variable(weights[j], old_masks[j].shape, specs[j].block_dims,
                                  specs[j].layer_axes) for j in magnitude]
  if hparams.global_pruning:
    sparsity = [jnp.reshape(sparsity_of(None), (1,))]
    # Every leaf stores the global threshold (once per layer of a stacked leaf).
    previous = [jnp.reshape(old_thresholds[magnitude[0]], (-1,))[:1]]
  else:
    sparsity = [jnp.full((v.num_layers,), sparsity_of(specs[j]), jnp.float32)
                for j, v in zip(magnitude, variables, strict=True)]
    previous = [jnp.reshape(old_thresholds[j], (-1,)) for j in magnitude]
  unit_thresholds, masks, nonfinite = masks_lib.update_masks(
      variables, sparsity, previous, [old_masks[j] for j in magnitude],
      nbins=hparams.nbins, threshold_decay=hparams.threshold_decay,
      threshold_method=hparams.threshold_method, pooling=hparams.block_pooling_function,
      global_threshold=hparams.global_pruning)
  for i, (j, mask) in enumerate(zip(magnitude, masks, strict=True)):
    new_masks[j] = mask
    shape = old_thresholds[j].shape
    new_thresholds[j] = jnp.broadcast_to(unit_thresholds[0 if hparams.global_pruning else i],
                                         (math.prod(shape),)).reshape(shape)
  return new_masks, new_thresholds, skips + jnp.sum(nonfinite, dtype=jnp.int32)


def _explicit_mesh(arrays: list[Array]) -> Any:
  """The mesh of the first array typed with explicit mesh axes, else None."""
  for array in arrays:
    mesh = getattr(jax.typeof(array).sharding, 'mesh', None)
    if mesh is not None and not mesh.empty and mesh.explicit_axes:
      return mesh
  return None


def _new_masks_on_any_mesh(compute, operands, state, sparsities):
  """`compute(operands, state, sparsities)`, also for arrays sharded over explicit mesh axes.

  Explicit axes (the default of `jax.make_mesh`) type every array with its
  sharding, and ops without a sharding rule (the block reshapes) refuse them.
  The mask update runs with automatic axes instead, where XLA's partitioner
  shards it as under `pjit`; masks come back sharded like the old masks,
  thresholds and the count replicated. Values closed over keep their explicit
  types, so the sparsities come in as arguments.
  """
  mesh = _explicit_mesh(jax.tree.leaves(operands))
  if mesh is None:
    return compute(operands, state, sparsities)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  out_sharding = ([jax.typeof(m).sharding for m in jax.tree.leaves(state.masks)],
                  [replicated for _ in jax.tree.leaves(state.thresholds)], replicated)
  return jax.sharding.auto_axes(compute, out_sharding=out_sharding)(operands, state, sparsities)


def pruning(hparams: ml_collections.ConfigDict | hparams_lib.HParams, *,
            sparsity_fn: SparsityFn | None = None,
            prune_filter: specs_lib.PruneFilter | None = None,
            mask_rule: MaskRule | None = None) -> optax.GradientTransformation:
  """Gradual magnitude pruning with TF `model_pruning` semantics, as an optax transform.

  Args:
    hparams: from `get_pruning_hparams()` / `parse_hparams(...)`; validated and
      parsed once, here.
    sparsity_fn: optional `step -> sparsity` (e.g. an optax schedule) replacing
      the polynomial schedule for every pruned leaf; it cannot be combined with
      `weight_sparsity_map`.
    prune_filter: optional `(name, leaf) -> bool` replacing `weight_name_regex`.
    mask_rule: optional `MaskRule` that picks the pruned leaves and computes
      their masks at each mask update, e.g. `jaxprune.channels.ChannelRule`
      for whole coupled channels; the schedule, gating and the application of
      the masks stay as above.

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.
  """
  hparams = hparams_lib.freeze(hparams)
  if sparsity_fn is not None and hparams.sparsity_entries:
    raise ValueError(
        f'weight_sparsity_map={[f"{r}:{v}" for r, v in hparams.sparsity_entries]!r} cannot be '
        'combined with sparsity_fn: per-variable targets follow the polynomial schedule. '
        'Drop one of them.')
  if mask_rule is not None:
    if prune_filter is not None:
      raise ValueError('prune_filter cannot be combined with mask_rule: the mask rule picks '
                       'the pruned leaves. Drop one of them.')
    mask_rule.check(hparams)

  def specs_of(params, warn=False):
    # Specs are rebuilt (from static shapes) at each trace; warn once, at init.
    return specs_lib.leaf_specs(params, hparams, prune_filter, warn=warn)

  def init_fn(params):
    if mask_rule is not None:
      masks, thresholds = mask_rule.init(params)
      return PruningState(
          step=jnp.zeros((), jnp.int32), last_update_step=jnp.zeros((), jnp.int32),
          masks=masks, thresholds=thresholds, nonfinite_skips=jnp.zeros((), jnp.int32),
          sparsity=jnp.zeros((), jnp.float32))
    specs = specs_of(params, warn=True)
    leaves, treedef = jax.tree.flatten(params)
    spec_list = specs_lib.spec_leaves(specs)
    for leaf, spec in zip(leaves, spec_list, strict=True):
      if spec is not None and spec.nm is not None:  # a bad N:M shape fails now, not at step one
        jax.eval_shape(lambda w, s=spec: nm_lib.nm_mask(w, *s.nm, axis=-2, name=s.name), leaf)
    masks = [None if s is None else jnp.ones(p.shape, bool)
             for p, s in zip(leaves, spec_list, strict=True)]
    # One threshold per layer of a stacked leaf, a scalar otherwise.
    thresholds = [None if s is None else jnp.zeros(p.shape[:s.layer_axes], jnp.float32)
                  for p, s in zip(leaves, spec_list, strict=True)]
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
    specs = specs_of(params) if mask_rule is None else None
    step = state.step
    global_sparsity = (schedule.sparsity_at(hparams, step) if sparsity_fn is None
                       else jnp.asarray(sparsity_fn(step), jnp.float32))

    def sparsity_of(spec):
      if sparsity_fn is not None or spec is None or spec.target == hparams.target_sparsity:
        return global_sparsity
      return schedule.sparsity_at(hparams, step, target=spec.target)

    do_update = schedule.should_update(hparams, step, state.last_update_step)
    old_masks = jax.tree.leaves(state.masks)
    old_thresholds = jax.tree.leaves(state.thresholds)
    if mask_rule is None:
      pruned = [i for i, spec in enumerate(specs_lib.spec_leaves(specs)) if spec is not None]
    else:
      mask_list = jax.tree.leaves(state.masks, is_leaf=lambda x: x is None)
      pruned = [i for i, mask in enumerate(mask_list) if mask is not None]
    param_leaves, update_leaves = jax.tree.leaves(params), jax.tree.leaves(updates)
    if hparams.mask_source == 'params':
      # The weights the step starts from: already in memory, so steps without an
      # update pay nothing for the update's conditional.
      operands = [param_leaves[i] for i in pruned]

      def values(operands):
        return [functools.partial(counting.fresh, p) for p in operands]
    else:
      # The weights as they will be stored (SPEC 7): optax.apply_updates casts
      # params + updates to the params' dtype.
      operands = ([param_leaves[i] for i in pruned], [update_leaves[i] for i in pruned])

      def values(operands):
        def stored(p, u, token):
          p, u = counting.fresh((p, u), token)
          return _as_stored(p + u, p.dtype)
        return [functools.partial(stored, p, u) for p, u in zip(*operands, strict=True)]

    def recompute(operands):
      if mask_rule is not None:
        def by_rule(operands, state, sparsities):
          masks, thresholds, skips = mask_rule.new_masks(
              hparams, values(operands), jax.tree.leaves(state.masks), state.thresholds,
              sparsities[0])
          return masks, jax.tree.leaves(thresholds), skips
        return _new_masks_on_any_mesh(by_rule, operands, state, [global_sparsity])
      # Sparsities by spec (None: the global one), as arguments for explicit meshes.
      keys = [None] + [s for s in specs_lib.spec_leaves(specs) if s is not None]

      def by_leaf(operands, state, sparsities):
        by_spec = dict(zip(keys, sparsities, strict=True))
        return _new_masks(hparams, specs, values(operands), state, lambda spec: by_spec[spec])
      return _new_masks_on_any_mesh(by_leaf, operands, state, [sparsity_of(k) for k in keys])

    def keep(_):
      return old_masks, old_thresholds, jnp.int32(0)

    new_masks, new_thresholds, skips = lax.cond(do_update, recompute, keep, operands)
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
