"""The pruning optax transform (docs/explanation/semantics.md#gating and #applying-the-masks).

Chain it after the optimizer:

    tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(hparams))

At a mask update it recomputes thresholds and masks from `params + updates`;
at every step it turns the update of each pruned weight into `-params`, so
after `optax.apply_updates` pruned weights are exactly zero and kept weights
are what the optimizer alone would give (Zhu & Gupta 2017, arXiv:1710.01878).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax import Array, lax

from jaxprune._checks import need_params
from jaxprune._config import hparams as hparams_lib
from jaxprune._config import schedule as schedule
from jaxprune._config import specs as specs_lib
from jaxprune._masks.magnitude import MagnitudeRule
from jaxprune._meshes import on_any_mesh
from jaxprune._search.counting import WeightReader
from jaxprune._transform import bits as bits
from jaxprune._transform import moved as moved_lib
from jaxprune._transform import order as order
from jaxprune._transform import sources as sources
from jaxprune._transform import updates as updates_lib
from jaxprune._transform.checks import check_arguments, check_like_init

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

  def new_masks(
    self,
    hparams: hparams_lib.HParams,
    weights: list[WeightReader],
    old_masks: list[Array],
    thresholds: PyTree,
    sparsity: Array,
  ) -> tuple[list[Array], PyTree, Array]:
    """At a mask update, inside jit: (masks, thresholds, int32 count of skipped units).

    `weights` are the pruned leaves' readers: `weights[i]()` is leaf i's array, and
    `jaxprune.WeightReader` says why the mask update hands out readers rather than
    arrays; `old_masks` are their masks, both in the params' order;
    `sparsity` is the schedule's (or `sparsity_fn`'s) value at this step, or what
    the rule's optional `sparsity(step, global_sparsity)` method returns (a pytree
    of arrays; the default rule gives each leaf its own target's schedule).
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
    moved_updates: int32, how many mask updates found pruned weights that were no
      longer zero. The transform zeroes them at every step, so something after it
      changed them: a transform chained after `pruning` (an optimizer placed after
      it, `optax.chain(pruning(hp), optax.adam(lr))`, trains the pruned weights
      again) or params edited outside the step. The accessors warn when it is not 0
      (docs/explanation/semantics.md#order-in-an-optax-chain).
  """

  step: Array
  last_update_step: Array
  masks: PyTree
  thresholds: PyTree
  nonfinite_skips: Array
  sparsity: Array
  moved_updates: Array


def _new_masks_on_any_mesh(compute, operands, state, sparsities):
  """`compute(operands, state, sparsities)`, also for arrays sharded over explicit mesh axes
  (`meshes.on_any_mesh`): masks come back sharded like the old masks, thresholds and the
  count replicated. The sparsities come in as arguments, not closed over."""

  def out_sharding(mesh):
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return (
      [jax.typeof(m).sharding for m in jax.tree.leaves(state.masks)],
      [replicated for _ in jax.tree.leaves(state.thresholds)],
      replicated,
    )

  return on_any_mesh(compute, out_sharding, operands, state, sparsities)


def _is_none(x: Any) -> bool:
  return x is None


def _pruned_indices(state: PruningState) -> list[int]:
  """Positions of the masked leaves in the params' flattening order."""
  masks = jax.tree.leaves(state.masks, is_leaf=_is_none)
  return [i for i, mask in enumerate(masks) if mask is not None]


def _masked(masks: PyTree, updates: PyTree, params: PyTree) -> PyTree:
  """Updates that leave pruned weights at exactly zero after `optax.apply_updates`."""
  return jax.tree.map(
    lambda mask, u, p: u if mask is None else updates_lib.masked_update(mask, u, p),
    masks,
    updates,
    params,
    is_leaf=_is_none,
  )


@jax.jit
def _updated_mask(do_update: Array, packed: Array, old_mask: Array) -> Array:
  """The mask after one step: `packed` unpacked at an update, `old_mask` otherwise."""
  return jnp.where(do_update, bits.unpacked(packed, old_mask.shape), old_mask)


class _Engine:
  """What `pruning` and `pruned` share: hparams, the rule, the state, one masking step."""

  def __init__(self, hparams, sparsity_fn, prune_filter, mask_rule):
    self.hparams = hparams_lib.freeze(hparams)
    if sparsity_fn is not None and self.hparams.sparsity_entries:
      raise ValueError(
        f'weight_sparsity_map={[f"{r}:{v}" for r, v in self.hparams.sparsity_entries]!r} '
        'cannot be combined with sparsity_fn: per-variable targets follow the polynomial '
        'schedule. Drop one of them.'
      )
    if mask_rule is not None:
      if prune_filter is not None:
        raise ValueError(
          'prune_filter cannot be combined with mask_rule: the mask rule picks '
          'the pruned leaves. Drop one of them.'
        )
      mask_rule.check(self.hparams)
    self.sparsity_fn, self.prune_filter, self.mask_rule = sparsity_fn, prune_filter, mask_rule

  def rule(self, params: PyTree, warn: bool = False) -> MaskRule:
    if self.mask_rule is not None:
      return self.mask_rule
    # Specs are rebuilt (from static shapes) at each trace; warn once, at init.
    specs = specs_lib.leaf_specs(params, self.hparams, self.prune_filter, warn=warn)
    return MagnitudeRule(self.hparams, specs, self.sparsity_fn)

  def init(self, params: PyTree) -> PruningState:
    """The pruning state of `params`."""
    rule = self.rule(params, warn=True)
    masks, thresholds = rule.init(params)
    if isinstance(rule, MagnitudeRule):
      rule.warn_subnormal(params, 'init')
    return PruningState(
      step=jnp.zeros((), jnp.int32),
      last_update_step=jnp.zeros((), jnp.int32),
      masks=masks,
      thresholds=thresholds,
      nonfinite_skips=jnp.zeros((), jnp.int32),
      sparsity=jnp.zeros((), jnp.float32),
      moved_updates=jnp.zeros((), jnp.int32),
    )

  def step(
    self, state: PruningState, params: PyTree, source: sources.Source
  ) -> tuple[PyTree, list[Array], PruningState]:
    """(masks, `source.passed_through` the conditional, new state) of one step: the
    schedule, the gating (docs/explanation/semantics.md#gating), and the rule's mask
    update under a conditional that reads only `source.operands`.
    """
    hparams, rule = self.hparams, self.rule(params)
    step = state.step
    global_sparsity = (
      schedule.sparsity_at(hparams, step)
      if self.sparsity_fn is None
      else jnp.asarray(self.sparsity_fn(step), jnp.float32)
    )
    sparsity_of = getattr(rule, 'sparsity', None)
    sparsity = global_sparsity if sparsity_of is None else sparsity_of(step, global_sparsity)
    do_update = schedule.should_update(hparams, step, state.last_update_step)
    old_masks, old_thresholds = jax.tree.leaves(state.masks), jax.tree.leaves(state.thresholds)

    def compute(operands, state, sparsity):
      masks, thresholds, skips = rule.new_masks(
        hparams, source.weights(operands), jax.tree.leaves(state.masks), state.thresholds, sparsity
      )
      return masks, jax.tree.leaves(thresholds), skips

    def recompute(operands):
      masks, thresholds, skips = _new_masks_on_any_mesh(compute, operands, state, sparsity)
      moved = (step > 0) & moved_lib.any_moved(old_masks, source.params(operands))
      packed = [bits.packed(m) for m in masks]
      return packed, thresholds, skips, moved.astype(jnp.int32), source.passed_through(operands)

    def keep(operands):
      packed = [jnp.zeros(bits.packed_shape(m.shape), jnp.uint8) for m in old_masks]
      return packed, old_thresholds, jnp.int32(0), jnp.int32(0), source.passed_through(operands)

    # The new masks leave the conditional as bits (1/8 byte a weight) and are unpacked
    # where the updates are masked: no mask-sized buffer is copied out of it.
    packed, new_thresholds, skips, moved, passed_through = lax.cond(
      do_update, recompute, keep, source.operands
    )
    new_masks = [_updated_mask(do_update, p, m) for p, m in zip(packed, old_masks, strict=True)]
    masks = jax.tree.unflatten(jax.tree.structure(state.masks), new_masks)
    return (
      masks,
      passed_through,
      PruningState(
        step=optax.safe_increment(step),
        last_update_step=jnp.where(do_update, step, state.last_update_step),
        masks=masks,
        thresholds=jax.tree.unflatten(jax.tree.structure(state.thresholds), new_thresholds),
        nonfinite_skips=state.nonfinite_skips + skips,
        sparsity=global_sparsity,
        moved_updates=state.moved_updates + moved,
      ),
    )

  def masked(
    self, state: PruningState, params: PyTree, updates: PyTree
  ) -> tuple[PyTree, PruningState]:
    """(updates after which pruned weights are zero, new state): one step's schedule,
    mask update (`step`) and masking of the optimizer's `updates`."""
    pruned = _pruned_indices(state)
    if self.hparams.mask_source == 'params':
      source = sources.from_params(params, pruned)
    else:
      source = sources.from_updates(params, updates, pruned)
    masks, passed_through, state = self.step(state, params, source)
    if passed_through:  # the pruned leaves' updates, read out of the conditional
      leaves, treedef = jax.tree.flatten(updates)
      for i, leaf in zip(pruned, passed_through, strict=True):
        leaves[i] = leaf
      updates = jax.tree.unflatten(treedef, leaves)
    return _masked(masks, updates, params), state


def pruning(
  hparams: ml_collections.ConfigDict | hparams_lib.HParams | str | None = None,
  *,
  sparsity_fn: SparsityFn | None = None,
  prune_filter: specs_lib.PruneFilter | None = None,
  mask_rule: MaskRule | None = None,
  **fields: Any,
) -> optax.GradientTransformation:
  """Gradual magnitude pruning with TF `model_pruning` semantics, as an optax transform.

  Chain it after the optimizer: `optax.chain(optax.adam(1e-3), pruning(hparams))`.
  `pruned(optax.adam(1e-3), hparams)` gives the same masks and params and cannot
  be put before the optimizer by mistake (see its docstring).

  Args:
    hparams: from `get_pruning_hparams()` / `parse_hparams(...)`, a dict of
      fields or a string in TF's syntax; None for the defaults. Validated and
      parsed once, here.
    sparsity_fn: optional `step -> sparsity` (e.g. an optax schedule) replacing
      the polynomial schedule for every pruned leaf; it cannot be combined with
      `weight_sparsity_map`.
    prune_filter: optional `(name, leaf) -> bool` replacing `weight_name_regex`.
    mask_rule: optional `MaskRule` that picks the pruned leaves and computes
      their masks at each mask update, e.g. `jaxprune.channels.ChannelRule`
      for whole coupled channels; the schedule, gating and the application of
      the masks stay as above. The default is the per-leaf magnitude rule
      (docs/explanation/semantics.md).
    fields: hparams fields by keyword, over `hparams`:
      `pruning(target_sparsity=0.8, sparsity_function_end_step=1000)`.

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxprune
    >>> hp = jaxprune.parse_hparams('target_sparsity=0.5,pruning_frequency=1,'
    ...                             'sparsity_function_end_step=1,threshold_method=exact')
    >>> tx = optax.chain(optax.sgd(0.0), jaxprune.pruning(hp))
    >>> params = {'Dense_0': {'kernel': jnp.array([[1., -4.], [3., 2.]])}}
    >>> state = tx.init(params)
    >>> for _ in range(2):  # no mask update at step 0; at step 1, s = 0.5
    ...   updates, state = tx.update(params, state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> params['Dense_0']['kernel']
    Array([[ 0., -4.],
           [ 3.,  0.]], dtype=float32)
  """
  check_arguments('jaxprune.pruning', hparams, sparsity_fn, prune_filter, mask_rule)
  engine = _Engine(hparams_lib.with_fields(hparams, fields), sparsity_fn, prune_filter, mask_rule)

  def update_fn(updates, state, params=None):
    params = need_params(params, 'jaxprune.pruning')
    order.warn_if_followed_in_a_chain('jaxprune.pruning')
    check_like_init(state.masks, params, updates)
    return engine.masked(state, params, updates)

  return optax.GradientTransformation(engine.init, update_fn)


def _refuse_pruning_inside(optimizer_state: Any) -> None:
  """ValueError when `pruned`'s optimizer holds a `pruning` of its own: the params would
  be pruned twice, the inner target silently winning wherever it is the higher."""

  def is_state(x: Any) -> bool:
    return isinstance(x, PruningState)

  if any(is_state(x) for x in jax.tree.leaves(optimizer_state, is_leaf=is_state)):
    raise ValueError(
      'jaxprune.pruned: the optimizer already holds a jaxprune.pruning(...), so the params '
      'would be pruned twice; give the optimizer alone, e.g. jaxprune.pruned(optax.adam(1e-3), '
      'target_sparsity=0.9), or keep the chain without pruned.'
    )


def pruned(
  optimizer: optax.GradientTransformation,
  hparams: ml_collections.ConfigDict | hparams_lib.HParams | str | None = None,
  *,
  sparsity_fn: SparsityFn | None = None,
  prune_filter: specs_lib.PruneFilter | None = None,
  mask_rule: MaskRule | None = None,
  **fields: Any,
) -> optax.GradientTransformation:
  """`optimizer` followed by gradual magnitude pruning, as one optax transform.

  The same masks, thresholds and params, bit for bit, as
  `optax.chain(optimizer, pruning(hparams, ...))`, and the same state (a tuple
  `(optimizer state, PruningState)`, so checkpoints of either form restore into
  the other), at the same cost: it runs `optimizer`, then the chained form's
  pruning step on its updates. What it adds is that pruning cannot be placed before
  the optimizer by mistake, and that extra keyword arguments reach the optimizer.

  Args:
    optimizer: any optax transform, e.g. `optax.adam(1e-3)`.
    hparams: the pruning hyperparameters: a ConfigDict from `get_pruning_hparams()` or
      `parse_hparams(...)`, a dict of fields, a string in TF's syntax
      (`'target_sparsity=0.9,weight_sparsity_map=[conv1:0.8]'`), or None for the
      defaults. Checked once, here.
    sparsity_fn: optional `step -> sparsity` (e.g. an optax schedule) in place of the
      polynomial schedule, for every pruned leaf; not with `weight_sparsity_map`.
    prune_filter: optional `(name, leaf) -> bool` choosing the pruned leaves in place
      of `weight_name_regex`.
    mask_rule: optional `MaskRule` computing the masks at each mask update, e.g.
      `jaxprune.channels.ChannelRule` for whole coupled channels; the default is the
      per-leaf magnitude rule.
    fields: hyperparameter fields by keyword, over `hparams`. The ones most set:
      `target_sparsity` (the final sparsity), `sparsity_function_end_step` (the step
      it is reached at), `weight_sparsity_map` (per-leaf targets by regex),
      `threshold_method` (`'histogram'`, TF's, or `'exact'`), `nm_sparsity` (N:M in
      place of a target), and `mask_source`: `'updated'` (the default, TF's order:
      thresholds of the weights after this step) or `'params'` (thresholds of the
      params the step starts from: no temporary copy of the updated weights, the
      option where memory decides whether a model fits). `get_pruning_hparams()`
      lists every field with its default.

  Returns:
    An `optax.GradientTransformationExtraArgs`: its `update(grads, state, params)`
    needs `params`, and hands any extra keyword arguments (e.g. `value=loss` for
    `optax.contrib.reduce_on_plateau`) to `optimizer`; apply its updates with
    `optax.apply_updates`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxprune
    >>> tx = jaxprune.pruned(optax.adam(1e-3), target_sparsity=0.9)
    >>> state = tx.init({'Dense_0': {'kernel': jnp.ones((4, 4))}})
    >>> type(state[1]).__name__  # (optimizer state, PruningState), as the chained form
    'PruningState'
  """
  check_arguments('jaxprune.pruned', hparams, sparsity_fn, prune_filter, mask_rule, optimizer)
  engine = _Engine(hparams_lib.with_fields(hparams, fields), sparsity_fn, prune_filter, mask_rule)

  def init_fn(params):
    inner = optimizer.init(params)
    _refuse_pruning_inside(inner)
    return inner, engine.init(params)

  def update_fn(grads, state, params=None, **extra_args):
    params = need_params(params, 'jaxprune.pruned')
    order.warn_if_followed_in_a_chain('jaxprune.pruned')
    inner, pruning_state = state
    check_like_init(pruning_state.masks, params, grads)
    updates, inner = optimizer.update(grads, inner, params, **extra_args)
    updates, pruning_state = engine.masked(pruning_state, params, updates)
    return updates, (inner, pruning_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
