"""Numbers a run reports about its pruning: per-step scalars and final per-leaf stats."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

import jaxprune
from jaxprune._config import specs as specs_lib
from jaxprune_train._report import LeafReport
from jaxprune_train._step import TrainState


def pruned_params(state: TrainState) -> dict[str, np.ndarray]:
  """The params the pruning transform masks, by name, fetched to host memory."""
  masks = jaxprune.get_masks(state.opt_state)
  # named_leaves skips the None masks of unpruned leaves.
  names = {name for name, _ in jaxprune.named_leaves(masks)}
  return {
    name: np.asarray(leaf) for name, leaf in jaxprune.named_leaves(state.params) if name in names
  }


def pruning_scalars(
  state: TrainState, hparams: ml_collections.ConfigDict | None
) -> dict[str, float | int]:
  """The pruning summaries of `state` plus global target and achieved sparsity.

  Args:
    state: the train state.
    hparams: the run's pruning hparams; None when the run does not prune.

  Returns:
    `jaxprune.summaries` (per pruned leaf '<leaf>/sparsity' and
    '<leaf>/threshold', '<name>/sparsity', '<name>/last_mask_update_step'),
    and 'target_sparsity' (the schedule's global value at the last update)
    and 'achieved_sparsity' (the fraction of exact zeros over all pruned
    leaves). Empty when `hparams` is None.
  """
  if hparams is None:
    return {}
  # .item() keeps integer summaries (the last update step) integers.
  scalars = {}
  for key, value in jax.device_get(jaxprune.summaries(state.opt_state, hparams)).items():
    value = np.asarray(value)
    if value.ndim == 0:
      scalars[key] = value.item()
      continue
    # A stacked leaf's threshold has one entry per layer: 'layers/q/kernel[1]/threshold'.
    leaf, _, what = key.rpartition('/')
    for index in np.ndindex(value.shape):
      scalars[f'{leaf}{_layer_suffix(index)}/{what}'] = value[index].item()
  scalars['target_sparsity'] = scalars[f'{hparams.name}/sparsity']
  leaves = pruned_params(state).values()
  size = sum(leaf.size for leaf in leaves)
  zeros = sum(int(np.sum(leaf == 0)) for leaf in leaves)
  scalars['achieved_sparsity'] = zeros / size if size else 0.0
  return scalars


def _layer_suffix(index: tuple[int, ...]) -> str:
  return '[' + ','.join(map(str, index)) + ']'


def leaf_reports(state: TrainState, hparams: ml_collections.ConfigDict | None) -> list[LeafReport]:
  """One `LeafReport` per pruned leaf (none when `hparams` is None).

  Each leaf's target, block shape (with -1 resolved) and N:M pattern are the
  ones the transform prunes it with (`jaxprune._config.specs.leaf_specs`).
  """
  if hparams is None:
    return []
  # Map entries that match no leaf were reported when the transform was built.
  specs = {
    spec.name: spec
    for spec in specs_lib.spec_leaves(specs_lib.leaf_specs(state.params, hparams, warn=False))
    if spec is not None
  }
  thresholds = {
    k: np.asarray(v) for k, v in jax.device_get(jaxprune.get_thresholds(state.opt_state)).items()
  }
  reports = []
  for name, leaf in pruned_params(state).items():
    spec = specs[name]
    # A stacked leaf (`layer_axes_map`) is pruned layer by layer: one row per layer.
    positions = spec.layer_at or tuple(range(spec.layer_axes))
    layers = np.moveaxis(leaf, positions, tuple(range(len(positions))))
    for index in np.ndindex(layers.shape[: len(positions)]):
      weight = layers[index]
      nonzero = int(np.count_nonzero(weight))
      if spec.nm is not None:
        # N:M keeps n of every m: no schedule, no threshold.
        target, threshold = 1 - spec.nm[0] / spec.nm[1], None
      else:
        target, threshold = spec.target, float(thresholds[name][index])
      reports.append(
        LeafReport(
          name=f'{name}{_layer_suffix(index)}' if positions else name,
          shape=tuple(weight.shape),
          nonzero=nonzero,
          target=target,
          achieved=1 - nonzero / weight.size,
          threshold=threshold,
          block=spec.block_dims,
          nm=spec.nm,
        )
      )
  return reports


def param_counts(params: Any) -> dict[str, int]:
  """`{'total_params': entries in all leaves, 'total_nonzero': nonzero entries}`."""
  leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(params)]
  return {
    'total_params': sum(leaf.size for leaf in leaves),
    'total_nonzero': sum(int(np.count_nonzero(leaf)) for leaf in leaves),
  }
