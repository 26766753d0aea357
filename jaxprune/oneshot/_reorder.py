"""`oneshot.permute_channels` and `prune(permute=)`: which layers to reorder the inputs of,
the scores to keep under N:M, and the reordering (`_permute`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _names as names_lib
from jaxprune._config import maps as maps
from jaxprune.oneshot import _capture as capture
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot import _layer_prune as layer_prune
from jaxprune.oneshot import _permute as permutation
from jaxprune.oneshot import _solvers as solvers
from jaxprune.oneshot._layers import Layer, layers_and_reasons

PyTree = Any
METHODS = inputs.METHODS


def permute_channels(
  fn: Callable[[PyTree, Any], Any],
  params: PyTree,
  calibration_batches: Iterable[Any],
  *,
  nm: str | tuple[int, int],
  method: str = 'wanda',
  layers: bool | str = True,
) -> tuple[PyTree, tuple[permutation.Permutation, ...]]:
  """Reorders the input channels of layers so that N:M keeps more of their score, and the
  same channels in every weight that holds them, so that `fn` computes the same function.

  The channels a layer reads, and every parameter axis indexed by them (the producer's
  output axis and bias, a norm's scale and bias, the other layers reading them), are one
  channel group of `jaxprune.structured.trace(fn, params, batch, norms='exact')`. The new
  order starts from RIA's channel reallocation (Zhang et al., ICLR 2024) or the identity,
  whichever keeps more, then swaps channels between groups of M while a swap keeps more
  (NVIDIA ASP's channel swaps, Pool & Yu 2021); the kept score never falls. `prune(...,
  permute=...)` runs this before pruning.

  Args:
    fn: the model, as `prune` takes it.
    params: the trained parameters.
    calibration_batches: the batches the scores' input norms are measured on (the first
      is also the one the outputs are checked on).
    nm: the N:M pattern the layers will be pruned to ('2:4' or (2, 4)).
    method: whose score to keep: 'magnitude' (|W|), 'wanda' and 'sparsegpt'
      (|W_ij| * ||X_j||_2), 'ria' (RIA's).
    layers: True for every layer, or a regex of the layer names to reorder the inputs of.

  Returns:
    (params with the channels reordered, a `Permutation` per channel group reordered).

  Raises:
    ValueError: one line naming a selected layer whose inputs cannot be reordered and
      why: they reach the model's input or output, they are a reshape into heads or a
      concatenation, the layer is a slice of a scanned stack, or `fn` captures a
      per-channel constant (the outputs changed).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxprune import oneshot
    >>> params = {'up': jax.random.normal(jax.random.key(0), (4, 8)),
    ...           'down': jax.random.normal(jax.random.key(1), (8, 4))}
    >>> fn = lambda p, x: jax.nn.relu(x @ p['up']) @ p['down']
    >>> x = jax.random.normal(jax.random.key(2), (16, 4))
    >>> new, done = oneshot.permute_channels(fn, params, [x], nm='2:4', layers='down')
    >>> bool(jnp.allclose(fn(new, x), fn(params, x), rtol=1e-5, atol=1e-5))
    True
    >>> done[0].kept_after >= done[0].kept_before
    True
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}: choose one of {METHODS}.')
  default = inputs.parse_target('permute_channels', None, nm)
  fn = inputs.model_function(fn, params)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = [leaf for _, leaf in flat]
  names = [names_lib.leaf_name(path) for path, _ in flat]
  closed, batches = inputs.read_batches(fn, params, calibration_batches)
  found, _ = layers_and_reasons(closed, names)
  if isinstance(layers, str):
    maps.check_regex('layers', layers)
  targets = {
    inputs.layer_key(layer): default
    if layers is True or (isinstance(layers, str) and re.search(layers, layer.name))
    else None
    for layer in found
  }
  inputs.check_nm(found, leaves, targets)
  inputs.check_conv_nm(found, leaves, targets)
  chosen = [layer for layer in found if targets[inputs.layer_key(layer)] is not None]
  new, done = permuted(fn, params, leaves, names, closed, batches, chosen, targets, method, layers)
  return jax.tree.unflatten(treedef, new), done


def score_matrices(
  closed: Any, layers: list[Layer], leaves: list[Any], batches: list[Any], method: str
) -> dict[str, np.ndarray]:
  """Each layer's score (outputs, inputs) on the dense model, as its method ranks weights
  (SparseGPT's, which depends on the order it visits the columns in, as Wanda's)."""
  stats = {}
  if method != 'magnitude':
    stats = capture.collector(closed, layers, ('sqnorm',))(leaves, batches)
  out = {}
  for layer in layers:
    w = layer_prune.weight_matrix(layer, leaves[layer.leaf])
    if method == 'magnitude':
      out[layer.name] = np.abs(np.asarray(w))
      continue
    sqnorm = stats[layer.leaf][0]['sqnorm']
    if method == 'ria':
      scores = solvers.ria_scores(
        w, jnp.repeat(sqnorm, w.shape[0] // layer.groups, axis=0), groups=layer.groups
      )
    else:
      scores = jnp.abs(w) * jnp.sqrt(jnp.repeat(sqnorm, w.shape[0] // layer.groups, axis=0))
    out[layer.name] = np.asarray(scores)
  return out


def permuted(fn, params, leaves, names, closed, batches, chosen, targets, method, permute):
  """`permute`'s leaves and permutations for the N:M layers it selects."""
  if not isinstance(permute, (bool, str)):
    raise ValueError(
      f'permute={permute!r}: give True (every N:M layer), a regex of layer names, or False.'
    )
  if isinstance(permute, str):
    maps.check_regex('permute', permute)
  selected = [
    layer
    for layer in chosen
    if targets[inputs.layer_key(layer)][1] is not None
    and (permute is True or re.search(permute, layer.name))
  ]
  if not selected:
    raise ValueError(
      f'permute={permute!r}: no layer with an N:M target'
      + ('' if permute is True else ' matches it')
      + '; channel permutation only helps N:M (give nm=..., or leave out permute).'
    )
  permutation.check_unstacked(selected)
  nm = {layer.name: targets[inputs.layer_key(layer)][1] for layer in selected}
  scores = score_matrices(closed, selected, leaves, batches, method)
  return permutation.permute(
    fn, params, batches[0], leaves, names, selected, nm, lambda layer: scores[layer.name]
  )
