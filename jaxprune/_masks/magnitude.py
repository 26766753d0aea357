"""The default mask rule: per-leaf magnitude thresholds and N:M patterns.

See docs/explanation/semantics.md#histogram-thresholds, #blocks and #names-and-maps.

`MagnitudeRule` is what `jaxprune.pruning(hparams)` runs when no other
`MaskRule` is given: each pruned leaf (chosen by `weight_name_regex` or a
`prune_filter`, see `specs`) gets the threshold of Zhu & Gupta 2017
(arXiv:1710.01878) with TF `model_pruning`'s histogram or exact rule, block
pooling and decay, or an N:M pattern along its input axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from jaxprune._config import hparams as hparams_lib
from jaxprune._config import schedule as schedule
from jaxprune._config import specs as specs_lib
from jaxprune._masks import nm as nm_lib
from jaxprune._masks import update as masks_lib
from jaxprune._search import subnormal as subnormal
from jaxprune._search.counting import WeightReader

PyTree = Any


class MagnitudeRule:
  """Per-leaf magnitude (or N:M) masks, as a `jaxprune.MaskRule`.

  Args:
    hparams: the frozen hparams.
    specs: `specs.leaf_specs(params, hparams, ...)`: a LeafSpec per pruned leaf.
    sparsity_fn: optional `step -> sparsity` replacing the polynomial schedule.
  """

  def __init__(
    self,
    hparams: hparams_lib.HParams,
    specs: PyTree,
    sparsity_fn: Callable[[Array], Array] | None = None,
  ):
    self.hparams = hparams
    self.specs = [s for s in specs_lib.spec_leaves(specs) if s is not None]
    self._all_specs = specs_lib.spec_leaves(specs)
    self.sparsity_fn = sparsity_fn

  def check(self, hparams: hparams_lib.HParams) -> None:
    del hparams  # every field applies to magnitude pruning

  def init(self, params: PyTree) -> tuple[PyTree, PyTree]:
    """All-True masks and zero thresholds (one per layer of a stacked leaf) for the pruned
    leaves, None elsewhere; a bad N:M shape fails here, not at step one."""
    leaves, treedef = jax.tree.flatten(params)
    masks, thresholds = [], []
    for leaf, spec in zip(leaves, self._all_specs, strict=True):
      if spec is None:
        masks.append(None)
        thresholds.append(None)
        continue
      if spec.nm is not None:
        jax.eval_shape(
          lambda w, s=spec: nm_lib.nm_mask(w, *s.nm, axis=s.nm_axis(w.ndim), name=s.name), leaf
        )
      masks.append(jnp.ones(leaf.shape, bool))
      layers = spec.front_shape(leaf.shape)[: spec.layer_axes]
      thresholds.append(jnp.zeros(layers, jnp.float32))
    return jax.tree.unflatten(treedef, masks), jax.tree.unflatten(treedef, thresholds)

  def warn_subnormal(self, params: PyTree, where: str) -> None:
    """Warns about pruned layers whose weights the backend reads as all zero (subnormal)."""
    leaves = jax.tree.leaves(params)
    subnormal.warn_subnormal(
      [
        (spec.name, leaf, 0 if self.hparams.global_pruning else spec.layer_at or spec.layer_axes)
        for leaf, spec in zip(leaves, self._all_specs, strict=True)
        if spec is not None
      ],
      where,
      together=self.hparams.global_pruning,
    )

  def sparsity(self, step: Array, global_sparsity: Array) -> list[Array]:
    """Each pruned leaf's sparsity at `step`: its `weight_sparsity_map` target's schedule."""
    if self.sparsity_fn is not None:
      return [global_sparsity for _ in self.specs]
    return [
      global_sparsity
      if s.target == self.hparams.target_sparsity
      else schedule.sparsity_at(self.hparams, step, target=s.target)
      for s in self.specs
    ]

  def new_masks(
    self,
    hparams: hparams_lib.HParams,
    weights: list[WeightReader],
    old_masks: list[Array],
    thresholds: PyTree,
    sparsity: Sequence[Array],
  ) -> tuple[list[Array], PyTree, Array]:
    """Thresholds, masks and the non-finite count after a mask update (inside jit).

    `weights` are the pruned leaves' `WeightReader`s (see `jaxprune.MaskRule`);
    `sparsity` is `self.sparsity(...)`.
    """
    treedef = jax.tree.structure(thresholds)
    old_thresholds = jax.tree.leaves(thresholds)
    new_masks, new_thresholds = list(old_masks), list(old_thresholds)
    skips = jnp.int32(0)
    magnitude = []
    for j, spec in enumerate(self.specs):
      if spec.nm is None:
        magnitude.append(j)
        continue
      # Two reads of the weights, each computed where it is read: the sum of w - w is
      # NaN exactly when a weight is NaN or infinite (arithmetic, which XLA:CPU fuses
      # into the reduction; a compare there would store a bool per weight).
      w = weights[j](jnp.int32(0)).astype(jnp.float32)
      finite = jnp.isfinite(jnp.sum(w - w))
      skips += (~finite).astype(jnp.int32)
      # Along the kernels' input axis (each layer's, for a stacked leaf).
      values = weights[j](None)
      mask = nm_lib.nm_mask(values, *spec.nm, axis=spec.nm_axis(values.ndim), name=spec.name)
      new_masks[j] = jnp.where(finite, mask, old_masks[j])
    if not magnitude:
      return new_masks, jax.tree.unflatten(treedef, new_thresholds), skips
    specs = self.specs
    # Layer axes named anywhere ('@' in layer_axes_map) are moved to the front, where the
    # per-layer rule finds them, and the masks moved back.
    variables = [
      masks_lib.Variable(
        (lambda pass_value, f=weights[j], s=specs[j]: s.to_front(f(pass_value)))
        if specs[j].moves_layers
        else weights[j],
        specs[j].front_shape(old_masks[j].shape),
        specs[j].block_dims,
        specs[j].layer_axes,
      )
      for j in magnitude
    ]
    if hparams.global_pruning:
      targets = [jnp.reshape(sparsity[magnitude[0]], (1,))]
      # Every leaf stores the global threshold (once per layer of a stacked leaf).
      previous = [jnp.reshape(old_thresholds[magnitude[0]], (-1,))[:1]]
    else:
      targets = [
        jnp.full((v.num_layers,), sparsity[j], jnp.float32)
        for j, v in zip(magnitude, variables, strict=True)
      ]
      previous = [jnp.reshape(old_thresholds[j], (-1,)) for j in magnitude]
    unit_thresholds, masks, nonfinite = masks_lib.update_masks(
      variables,
      targets,
      previous,
      [specs[j].to_front(old_masks[j]) for j in magnitude],
      nbins=hparams.nbins,
      threshold_decay=hparams.threshold_decay,
      threshold_method=hparams.threshold_method,
      pooling=hparams.block_pooling_function,
      global_threshold=hparams.global_pruning,
      mask_search=hparams.mask_search,
    )
    for i, (j, mask) in enumerate(zip(magnitude, masks, strict=True)):
      new_masks[j] = specs[j].from_front(mask)
      shape = old_thresholds[j].shape
      new_thresholds[j] = jnp.broadcast_to(
        unit_thresholds[0 if hparams.global_pruning else i], (math.prod(shape),)
      ).reshape(shape)
    return (
      new_masks,
      jax.tree.unflatten(treedef, new_thresholds),
      skips + jnp.sum(nonfinite, dtype=jnp.int32),
    )
