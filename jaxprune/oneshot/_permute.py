"""Channel permutation for N:M: reorder a layer's input channels so that its N:M groups keep
more of its score, and reorder the same channels everywhere else they appear, so that the
model computes the same function.

Which weights hold the channels a layer reads comes from `jaxprune.structured.trace` (with
`norms='exact'`: a norm's sums over the channels do not depend on their order): the channel
group that owns the layer's input axis lists every parameter axis indexed by those channels
(the producer's output axis and bias, a norm's scale, the other layers reading them). A group
that cannot be pruned cannot be permuted either (it reaches the model's input or output, a
reshape, a primitive that mixes channels); nor can a layer whose input axis is shared by
several groups (a reshape of heads x head_dim, a concatenation).

The search (on the host, in numpy) starts from the better of the identity and RIA's channel
reallocation (Zhang et al., ICLR 2024: the channels sorted by their summed score, dealt
over the M positions of the groups, every other sweep reversed), then swaps pairs of channels
between groups while a swap raises the kept score (NVIDIA ASP's channel-swap refinement,
Pool & Yu 2021, "Channel Permutations for N:M Sparsity"), a few passes at most.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxprune.oneshot._layers import Layer

_PASSES = 4
_CHUNK = 2**22  # floats per block of candidate swaps


@dataclasses.dataclass(frozen=True, eq=False)  # `order` is an array: compared by identity
class Permutation:
  """One channel group reordered for N:M (`oneshot.permute_channels`, `prune(permute=)`).

  Attributes:
    layers: the N:M layers reading the channels, whose kept score was raised.
    members: `(leaf name, axis)` of every parameter axis reordered.
    order: int array: new channel `c` is old channel `order[c]`.
    kept_before: the layers' summed score kept by N:M in the original order.
    kept_after: the same in the new order (>= `kept_before`).
  """

  layers: tuple[str, ...]
  members: tuple[tuple[str, int], ...]
  order: np.ndarray
  kept_before: float
  kept_after: float


def kept_score(scores: np.ndarray, n: int, m: int) -> float:
  """The sum, over rows and groups of `m` consecutive columns, of the `n` largest scores."""
  blocks = np.sort(scores.reshape(scores.shape[0], -1, m), axis=-1)
  return float(blocks[..., m - n :].sum())


def reallocation(scores: np.ndarray, m: int) -> np.ndarray:
  """RIA's heuristic channel reallocation: the order of the columns."""
  c = scores.shape[1]
  ranked = np.argsort(scores.sum(0), kind='stable')
  order = np.zeros(c, np.int64)
  for i in range(m):
    chunk = ranked[c * i // m : c * (i + 1) // m]
    order[i::m] = chunk if i % 2 == 0 else chunk[::-1]
  return order


def best_order(scores: np.ndarray, n: int, m: int, passes: int = _PASSES) -> np.ndarray:
  """An order of the columns of `scores` (rows, channels) whose N:M kept score is at least
  the identity's: the better start, then greedy swaps between groups."""
  scores = np.asarray(scores, np.float64)
  c = scores.shape[1]
  order = np.arange(c)
  heuristic = reallocation(scores, m)
  if kept_score(scores[:, heuristic], n, m) > kept_score(scores, n, m):
    order = heuristic
  groups = c // m
  if groups < 2 or n >= m:
    return order
  tolerance = 1e-9 * max(kept_score(scores, n, m), 1e-30)
  t = scores[:, order].reshape(scores.shape[0], groups, m).transpose(1, 0, 2).copy()  # (G, R, m)
  p, q, old = _summaries(t, n)
  for _ in range(passes):
    improved = False
    for a in range(groups):
      gain, (i, b, j) = _best_swap(t, p, q, old, a)
      if gain > tolerance:
        order[[a * m + i, b * m + j]] = order[[b * m + j, a * m + i]]
        t[a, :, i], t[b, :, j] = t[b, :, j].copy(), t[a, :, i].copy()
        for g in (a, b):
          p[g], q[g], old[g] = (x[0] for x in _summaries(t[g : g + 1], n))
        improved = True
    if not improved:
      break
  return order


def _summaries(t: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per group (t: (G, R, m)) and channel i: P (G, m), the n - 1 largest of the group's
  other scores summed over the rows; Q (G, R, m), the n-th largest of them; and the
  group's kept score (G,)."""
  m = t.shape[2]
  others = np.stack([np.delete(t, i, axis=2) for i in range(m)], axis=2)  # (G, R, m, m-1)
  others = -np.sort(-others, axis=3)  # descending
  kept = np.sort(t, axis=2)[..., m - n :].sum((1, 2))
  return others[..., : n - 1].sum(3).sum(1), others[..., n - 1], kept


def _best_swap(
  t: np.ndarray, p: np.ndarray, q: np.ndarray, old: np.ndarray, a: int
) -> tuple[float, tuple[int, int, int]]:
  """The largest gain of swapping a channel of group `a` with one of another group:
  (gain, (i, b, j)) for channel i of a and channel j of b.

  A group that loses channel i and takes a value y keeps, per row, `P_i + max(y, Q_i)`
  (`_summaries`): y is among the kept n exactly when it beats Q_i."""
  groups, rows, m = t.shape
  step = max(1, _CHUNK // (m * m * rows))
  best, where = -np.inf, (0, 0, 0)
  ta, qa = t[a].T, q[a].T  # (m, R)
  for start in range(0, groups, step):
    tb = t[start : start + step].transpose(0, 2, 1)  # (B, m_j, R)
    qb = q[start : start + step].transpose(0, 2, 1)
    # Group a takes b's channel j in place of its i; group b takes a's channel i for its j.
    into_a = np.maximum(tb[:, None, :, :], qa[None, :, None, :]).sum(-1)  # (B, m_i, m_j)
    into_b = np.maximum(ta[None, :, None, :], qb[:, None, :, :]).sum(-1)
    gain = into_a + into_b + p[a][None, :, None] + p[start : start + step][:, None, :]
    gain -= old[a] + old[start : start + step, None, None]
    if start <= a < start + step:
      gain[a - start] = -np.inf
    k = int(np.argmax(gain))
    if gain.flat[k] > best:
      b, i, j = np.unravel_index(k, gain.shape)
      best, where = float(gain.flat[k]), (int(i), start + int(b), int(j))
  return best, where


def _reorder(leaf: Any, axis: int, positions: np.ndarray, order: np.ndarray) -> Any:
  """`leaf` with the entries at `positions` along `axis` reordered: position `positions[c]`
  takes what was at `positions[order[c]]`."""
  index = np.arange(leaf.shape[axis])
  index[positions] = positions[order]
  return jax.numpy.take(leaf, index, axis=axis)


def permute(
  fn: Callable[[Any, Any], Any],
  params: Any,
  batch: Any,
  leaves: list[Any],
  names: list[str],
  layers: Sequence[Layer],
  nm: dict[str, tuple[int, int]],
  scores: Callable[[Layer], np.ndarray],
) -> tuple[list[Any], tuple[Permutation, ...]]:
  """New leaves with the input channels of `layers` reordered, and what was done.

  Args:
    fn: the model `fn(params, batch)`.
    params: the params tree (for the trace; `leaves` are its leaves).
    batch: a calibration batch, to trace and to check that the outputs are unchanged.
    leaves, names: the params' leaves and their names.
    layers: the N:M layers to permute the inputs of.
    nm: each layer's (n, m) by name.
    scores: a layer's score matrix (outputs, inputs), as numpy.

  Returns:
    (the leaves, one `Permutation` per channel group reordered).

  Raises:
    ValueError: one line naming a layer whose input channels cannot be reordered, and why.
  """
  from jaxprune import structured  # a heavy import, needed only here

  check_unstacked(layers)
  try:
    graph = structured.trace(fn, params, batch, norms='exact')
  except Exception as err:  # the structured trace cannot follow this model
    first = (str(err).strip().splitlines() or [''])[0][:300]
    raise ValueError(
      f'permute: jaxprune.structured.trace could not trace fn ({type(err).__name__}: '
      f'{first}); leave out permute.'
    ) from err
  by_group: dict[int, list[Layer]] = {}
  for layer in layers:
    group = _input_group(graph, layer, leaves)
    by_group.setdefault(group.id, []).append(layer)
  index = {name: i for i, name in enumerate(names)}
  current = list(leaves)
  done = []
  for group_id, readers in by_group.items():
    group = graph.groups[group_id]
    patterns = {nm[layer.name] for layer in readers}
    if len(patterns) > 1:
      raise ValueError(
        f'permute: layers {[layer.name for layer in readers]} read the same channels with '
        f'different N:M patterns {sorted(patterns)}; give them one pattern or leave some out '
        'with permute=<regex>.'
      )
    n, m = patterns.pop()
    matrix = np.concatenate([_channel_scores(layer, scores(layer), leaves) for layer in readers])
    order = best_order(matrix, n, m)
    for member in group.members:
      leaf = index[member.leaf]
      current[leaf] = _reorder(current[leaf], member.axis, member.indices[:, 0], order)
    done.append(
      Permutation(
        tuple(layer.name for layer in readers),
        tuple((member.leaf, member.axis) for member in group.members),
        order,
        kept_score(matrix, n, m),
        kept_score(matrix[:, order], n, m),
      )
    )
  _check_same_outputs(fn, params, current, batch, done)
  return current, tuple(done)


def check_unstacked(layers: Sequence[Layer]) -> None:
  """A ValueError naming a slice of a stacked leaf: its slices share their input axis."""
  for layer in layers:
    if layer.stack is not None:
      raise ValueError(
        f'permute: layer {layer.name!r} is a slice of weights stacked under a scan, whose '
        'slices share their input axis; permute only unstacked layers (permute=<regex>).'
      )


def _input_group(graph: Any, layer: Layer, leaves: list[Any]) -> Any:
  """The channel group that owns all of the layer's input features, or a ValueError."""
  axis = layer.in_axes[-1]  # a convolution's input features; a matmul's one input axis
  if len(layer.in_axes) > 1 and not layer.sites[0].conv:
    raise ValueError(
      f'permute: layer {layer.name!r} contracts several axes {layer.in_axes} of its weight; '
      'its N:M groups span them, so its channels cannot be reordered alone; leave it out '
      'with permute=<regex>.'
    )
  parts = graph.leaf_axes.get(layer.name, {}).get(axis, [])
  size = leaves[layer.leaf].shape[axis]
  if len(parts) != 1 or parts[0].indices.shape[1] != 1:
    raise ValueError(
      f'permute: the inputs of layer {layer.name!r} (axis {axis}) are '
      + (
        'not channels structured.trace follows'
        if not parts
        else 'a merged axis (a reshape into heads, a flatten, a concatenation or grouped features)'
      )
      + ', so they cannot be reordered; leave it out with permute=<regex>.'
    )
  group = graph.groups[parts[0].group_id]
  if not group.prunable:
    raise ValueError(
      f'permute: the input channels of layer {layer.name!r} cannot be reordered (their '
      f'channel group: {group.reason}); leave it out with permute=<regex>.'
    )
  if not np.array_equal(parts[0].indices[:, 0], np.arange(size)):
    raise ValueError(
      f'permute: layer {layer.name!r} reads its input channels in an order of its own '
      '(a slice or a concatenation); leave it out with permute=<regex>.'
    )
  return group


def _channel_scores(layer: Layer, scores: np.ndarray, leaves: list[Any]) -> np.ndarray:
  """A layer's (outputs, inputs) scores as (outputs x kernel positions, input features):
  a convolution's N:M groups lie along its input features at each kernel position."""
  features = leaves[layer.leaf].shape[layer.in_axes[-1]]
  return scores.reshape(-1, features)


def _check_same_outputs(fn, params, leaves, batch, done) -> None:
  """A ValueError when the reordered model's outputs differ from the model's on `batch` (a
  channel-indexed constant that fn captures, which no trace can reorder)."""
  before = jax.tree.leaves(fn(params, batch))
  after = jax.tree.leaves(fn(jax.tree.unflatten(jax.tree.structure(params), leaves), batch))
  for x, y in zip(before, after, strict=True):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(np.max(np.abs(x)), 1e-30)
    if not np.allclose(x, y, rtol=1e-4, atol=1e-5 * scale):
      raise ValueError(
        f'permute: reordering the channels read by {[p.layers for p in done]} changed the '
        "model's outputs (a per-channel constant that fn captures, not a parameter, cannot "
        'be reordered); leave those layers out with permute=<regex>.'
      )
