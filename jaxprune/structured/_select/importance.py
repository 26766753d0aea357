"""Channel importance: one score per channel of every channel group.

A channel's score sums a statistic over the slices it owns in all members of
its group (the producer's output filter, its bias, the BatchNorm entries and
the consumer's input rows), then each group is divided by its mean so that
scores of groups of different sizes and scales can be ranked together
(Torch-Pruning's group importance with mean normalisation; ENOT normalises the
same way before its global selectors).

Scores are `{group id: float64 array of shape (group.size,)}`; smaller means
less important, removed first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _names as names
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.progress import progress_bar

Scores = dict[int, np.ndarray]
PyTree = Any

# Running statistics say nothing about how much a channel contributes.
_STATS = re.compile(r'(^|/)(batch_stats/|mean$|var$)')


def is_weight(leaf: str) -> bool:
  """Whether a leaf counts for weight-based importance (not a running statistic)."""
  return _STATS.search(leaf) is None


def mean_normalised(scores: np.ndarray) -> np.ndarray:
  """Scores divided by their mean (all zeros when the mean is not positive; NaN
  scores stay NaN, for `score_channels` to refuse)."""
  mean = float(np.mean(scores)) if scores.size else 0.0
  if np.isnan(mean):
    return scores
  if mean <= 0.0 or not np.isfinite(mean):
    return np.zeros_like(scores)
  return scores / mean


def _reduce_positions(array: np.ndarray, axis: int, reduce: Callable) -> np.ndarray:
  """Reduces every position of `axis` over all other axes -> shape (n,)."""
  moved = np.moveaxis(np.asarray(array, dtype=np.float64), axis, 0)
  return reduce(moved.reshape(moved.shape[0], -1))


def group_scores(
  graph: DependencyGraph,
  leaves: Mapping[str, Any],
  reduce: Callable,
  leaf_filter: Callable[[str], bool] = is_weight,
  normalise: bool = True,
) -> Scores:
  """Sums a per-position statistic over each channel's slices in its group.

  Args:
    graph: a DependencyGraph.
    leaves: leaf name -> array (members whose leaf is missing are skipped).
    reduce: maps a (positions, rest) float64 array to a (positions,) statistic.
    leaf_filter: which member leaves count.
    normalise: divide each group's scores by their mean.

  Returns:
    `{group id: scores of shape (group.size,)}` for every group.
  """
  cache: dict[tuple[str, int], np.ndarray] = {}
  scores = {}
  for group in graph.groups:
    total = np.zeros(group.size, np.float64)
    for member in group.members:
      if member.leaf not in leaves or not leaf_filter(member.leaf):
        continue
      key = (member.leaf, member.axis)
      if key not in cache:
        cache[key] = _reduce_positions(leaves[member.leaf], member.axis, reduce)
      total += cache[key][np.asarray(member.indices)].sum(axis=1)
    scores[group.id] = mean_normalised(total) if normalise else total
  return scores


def magnitude_importance(graph: DependencyGraph, variables: PyTree, p: int = 2) -> Scores:
  """L1 (`p=1`) or L2 (`p=2`) norm of each channel's weight slices.

  For L2 the squares are summed over all the group's slices before the root,
  so a channel is scored by the norm of everything it owns.
  """
  if p not in (1, 2):
    raise ValueError(f'p={p!r}: only the L1 (p=1) and L2 (p=2) norms are supported.')
  reduce = (lambda x: np.abs(x).sum(1)) if p == 1 else (lambda x: np.square(x).sum(1))
  raw = group_scores(graph, dict(names.named_leaves(variables)), reduce, normalise=False)
  if p == 2:
    raw = {gid: np.sqrt(s) for gid, s in raw.items()}
  return {gid: mean_normalised(s) for gid, s in raw.items()}


def bn_scale_importance(graph: DependencyGraph, variables: PyTree) -> Scores:
  """|scale| of the normalisation layers in the group (Liu et al. 2017, network slimming).

  Groups with no `scale` member fall back to the L2 magnitude, so every group
  can still be ranked.
  """
  leaves = dict(names.named_leaves(variables))
  is_scale = lambda leaf: leaf.rsplit('/', 1)[-1] == 'scale'
  scales = group_scores(graph, leaves, lambda x: np.abs(x).sum(1), leaf_filter=is_scale)
  fallback = magnitude_importance(graph, variables, p=2)
  out = {}
  for group in graph.groups:
    has_scale = any(is_scale(m.leaf) and m.leaf in leaves for m in group.members)
    out[group.id] = scales[group.id] if has_scale else fallback[group.id]
  return out


def random_importance(graph: DependencyGraph, seed: int = 0) -> Scores:
  """Uniform random scores: the baseline every criterion should beat."""
  rng = np.random.default_rng(seed)
  return {group.id: rng.uniform(size=group.size) for group in graph.groups}


def _mask_for(leaf: str, masks: Mapping[str, Any]) -> Any:
  # Masks usually come from the optax state over `params` only, so their names
  # lack the collection prefix that the traced variables carry.
  for name, mask in masks.items():
    if mask is not None and (leaf == name or leaf.endswith('/' + name)):
      return mask
  return None


def _checked_masks(masks: PyTree | None) -> dict[str, Any]:
  """`{leaf name: mask}` of a masks pytree; a TypeError for anything but arrays."""
  if masks is None:
    return {}
  leaves = {name: m for name, m in names.named_leaves(masks) if m is not None}
  wrong = [m for m in leaves.values() if not hasattr(m, 'shape')]
  if wrong or not leaves:
    raise TypeError(
      'masks: give the pytree of boolean masks jaxprune.get_masks(state) returns (arrays '
      f'shaped like the params), got {type(masks).__name__} {str(masks)[:60]!r}.'
    )
  return leaves


def density_importance(
  graph: DependencyGraph, variables: PyTree, masks: PyTree | None = None
) -> Scores:
  """Fraction of nonzero (or mask-kept) entries in each channel's slices.

  After gradual magnitude pruning a channel whose slices are all zero scores 0
  and is removed first, so a structured pass only cuts what is already dead
  before touching live channels.

  Args:
    graph: a DependencyGraph.
    variables: the variables; used where no mask is given.
    masks: optional pytree of boolean masks (e.g. `jaxprune.get_masks(state)`),
      matched to members by leaf name or name suffix; `None` leaves are ignored.
      Anything but arrays, masks none of whose names is a weight of `variables`, or
      a mask shaped unlike its leaf is an error.

  Returns:
    Scores in [0, 1], not mean-normalised (a density is comparable across groups).
  """
  leaves = dict(names.named_leaves(variables))
  mask_leaves = _checked_masks(masks)
  counted, matched = {}, 0
  for leaf, value in leaves.items():
    if not is_weight(leaf) or not jnp.issubdtype(jnp.asarray(value).dtype, jnp.floating):
      continue
    mask = _mask_for(leaf, mask_leaves)
    if mask is not None and np.shape(mask) != np.shape(value):
      raise ValueError(
        f'masks: the mask of {leaf!r} has shape {np.shape(mask)}, the leaf {np.shape(value)}; '
        'give jaxprune.get_masks(state) of the optimizer that trained these variables.'
      )
    matched += mask is not None
    counted[leaf] = np.asarray(value if mask is None else mask) != 0
  if mask_leaves and not matched:
    raise ValueError(
      f"masks: none of the masks' names ({', '.join(list(mask_leaves)[:3])}) is a weight of "
      f'the variables ({", ".join(list(counted)[:3])}); give jaxprune.get_masks(state) of '
      'the optimizer that trained these variables.'
    )
  nonzero = group_scores(graph, counted, lambda x: x.sum(1), normalise=False)
  sizes = group_scores(
    graph, counted, lambda x: np.full(x.shape[0], x.shape[1], np.float64), normalise=False
  )
  return {gid: np.divide(nonzero[gid], np.maximum(sizes[gid], 1.0)) for gid in nonzero}


def taylor_importance(
  graph: DependencyGraph,
  variables: PyTree,
  loss_fn: Callable[[PyTree, Any], Any],
  batches: Iterable[Any],
  progress: bool = False,
) -> Scores:
  """First-order Taylor importance |w * dL/dw| (Molchanov et al. 2019, arXiv 1906.10771).

  The elementwise |w * grad| is averaged over the calibration batches, then
  summed over each channel's slices.

  Args:
    graph: a DependencyGraph.
    variables: the dense variables.
    loss_fn: `loss_fn(variables, batch) -> scalar`.
    batches: an iterable of calibration batches (a few are enough).
    progress: show a tqdm progress bar.

  Returns:
    Mean-normalised scores per group.
  """
  named = names.named_leaves(variables)
  leaves, tree = jax.tree.flatten(variables)
  # Integer leaves (NNX rng counters, step counts) have no gradient.
  is_float = [jnp.issubdtype(jnp.result_type(x), jnp.floating) for x in leaves]
  floats = [x for x, f in zip(leaves, is_float, strict=True) if f]
  float_names = [n for (n, _), f in zip(named, is_float, strict=True) if f]

  def loss_of_floats(floats, batch):
    it = iter(floats)
    full = [next(it) if f else x for x, f in zip(leaves, is_float, strict=True)]
    return loss_fn(jax.tree.unflatten(tree, full), batch)

  @jax.jit
  def saliency(floats, batch):
    grads = jax.grad(loss_of_floats)(floats, batch)
    return [jnp.abs(w * g) for w, g in zip(floats, grads, strict=True)]

  if progress:
    batches = progress_bar(batches, 'taylor importance')
  total, count = None, 0
  for batch in batches:
    step = saliency(floats, batch)
    total = step if total is None else [a + b for a, b in zip(total, step, strict=True)]
    count += 1
  if total is None:
    raise ValueError('batches: taylor importance needs at least one calibration batch.')
  mean = {name: np.asarray(v) / count for name, v in zip(float_names, total, strict=True)}
  return group_scores(graph, mean, lambda x: x.sum(1))


def score_channels(
  graph: DependencyGraph,
  variables: PyTree,
  method: str | Mapping[int, Any] = 'l2',
  *,
  masks: PyTree | None = None,
  seed: int = 0,
) -> Scores:
  """Scores every group with a named criterion, or validates precomputed scores.

  Args:
    graph: a DependencyGraph.
    variables: the dense variables.
    method: 'l1', 'l2', 'bn_scale', 'density' (zero fraction from masks),
      'random', or a mapping `{group id: scores}` (e.g. from `taylor_importance`).
    masks: masks for 'density'.
    seed: seed for 'random'.

  Returns:
    `{group id: float64 array of shape (group.size,)}`.
  """
  if isinstance(method, Mapping):
    return _finite(graph, _given_scores(graph, method), 'the given scores')
  check_method(method)
  methods = {
    'l1': lambda: magnitude_importance(graph, variables, p=1),
    'l2': lambda: magnitude_importance(graph, variables, p=2),
    'bn_scale': lambda: bn_scale_importance(graph, variables),
    'density': lambda: density_importance(graph, variables, masks),
    'random': lambda: random_importance(graph, seed),
  }
  return _finite(graph, methods[method](), f'importance={method!r}')


def _finite(graph: DependencyGraph, scores: Scores, what: str) -> Scores:
  """Raises a ValueError when a prunable group has a NaN score (its order is undefined)."""
  for gid, score in scores.items():
    bad = int(np.isnan(score).sum())
    if bad and graph.groups[gid].prunable:
      raise ValueError(
        f'importance[{gid}]: {bad} of {score.size} scores are NaN ({what}); channels cannot '
        'be ranked. Replace them (e.g. np.nan_to_num for given scores), or, when the scores '
        'come from the weights, check the variables for NaN.'
      )
  return scores


METHODS = ('l1', 'l2', 'bn_scale', 'density', 'random')


def check_method(method: Any, extra: tuple[str, ...] = ()) -> None:
  """Checks an importance name (or a `{group id: scores}` mapping) before any work."""
  if isinstance(method, Mapping):
    return
  if method not in METHODS + extra:
    raise ValueError(
      f'importance={method!r}: use one of {sorted(METHODS + extra)}, or pass '
      'precomputed scores (e.g. from taylor_importance) as {group id: array}.'
    )


def _given_scores(graph: DependencyGraph, given: Mapping[int, Any]) -> Scores:
  sizes = {group.id: group.size for group in graph.groups}
  unknown = sorted(set(given) - set(sizes), key=str)
  if unknown:
    prunable = [g.id for g in graph.groups if g.prunable]
    raise ValueError(
      f'importance: group id(s) {unknown} do not exist; scores are keyed by '
      f'group id, the prunable groups are {prunable}.'
    )
  out = {}
  for gid, score in given.items():
    score = np.asarray(score, np.float64)
    if score.shape != (sizes[gid],):
      raise ValueError(
        f'importance[{gid}]: shape {score.shape}, expected '
        f'({sizes[gid]},) (one score per channel of the group).'
      )
    out[gid] = score
  return out
