"""Which leaves are pruned, and each one's target and block shape.

See docs/explanation/semantics.md#names-and-maps.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune._config import hparams as hparams_lib
from jaxprune._config import maps as maps
from jaxprune._names import leaf_name, named_leaves

PyTree = Any
PruneFilter = Callable[[str, Any], bool]
# Leaf names listed in a warning before the rest are counted.
_SHOWN_NAMES = 20


@dataclasses.dataclass(frozen=True)
class LeafSpec:
  """How one pruned leaf is pruned.

  Attributes:
    name: the leaf's name (key path joined with '/').
    target: its final sparsity (its `weight_sparsity_map` entry, else the global one).
    block_dims: (height, width) with -1 already resolved for one layer's shape.
    nm: (n, m) for N:M sparsity along the input axis, or None.
    layer_axes: how many axes index stacked layers (0: one variable).
    layer_at: the indices of those axes, ascending, when they are not the leading ones
      (`layer_axes_map`'s '@' form); () when they lead.
  """

  name: str
  target: float
  block_dims: tuple[int, int]
  nm: tuple[int, int] | None = None
  layer_axes: int = 0
  layer_at: tuple[int, ...] = ()

  @property
  def moves_layers(self) -> bool:
    """Whether the layer axes must be moved to the front for the per-layer rule."""
    return bool(self.layer_at)

  def to_front(self, x: Any) -> Any:
    """`x` (of the leaf's shape) with its layer axes moved to the front, in order."""
    if not self.moves_layers:
      return x
    return jnp.moveaxis(x, self.layer_at, tuple(range(self.layer_axes)))

  def from_front(self, x: Any) -> Any:
    """The inverse of `to_front`: the leaf's own axis order again."""
    if not self.moves_layers:
      return x
    return jnp.moveaxis(x, tuple(range(self.layer_axes)), self.layer_at)

  def front_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The leaf's `shape` with its layer axes first: (layers..., one layer's axes...)."""
    shape = tuple(shape)
    if not self.moves_layers:
      return shape
    rest = [d for i, d in enumerate(shape) if i not in self.layer_at]
    return tuple(shape[i] for i in self.layer_at) + tuple(rest)

  def nm_axis(self, ndim: int) -> int:
    """The leaf axis N:M groups run along: each layer's input axis (its second to last)."""
    if not self.moves_layers:
      return -2
    rest = [i for i in range(ndim) if i not in self.layer_at]
    if len(rest) < 2:
      raise ValueError(
        f'N:M: leaf {self.name!r} leaves each layer {len(rest)} axis after its layer axes '
        f"{self.layer_at}, but N:M groups run along a layer's input axis (its second to "
        'last): leave the leaf out of the N:M pattern.'
      )
    return rest[-2]


def leaf_filter(
  selector: str | PruneFilter, *, field: str = 'weight_name_regex', min_ndim: int = 2
) -> PruneFilter:
  """The predicate `(name, leaf) -> bool` that picks the pruned leaves: jaxprune's one selector.

  A regex picks the leaves whose name (`jaxprune.leaf_name`) it matches with
  `re.search` and that have at least `min_ndim` axes: 2 for `pruning`, `pruned` and
  `jaxprune.sparse` (weights, not biases or scales), 0 for `jaxprune.functional`, where
  the regex names the leaves to prune as torch names a parameter (a bias too). A
  predicate replaces the regex and the axes rule. Either way a leaf without elements,
  or None, is never picked: there is nothing to prune.

  Args:
    selector: a regex string or a predicate `(name, leaf) -> bool`.
    field: the argument's name, for the errors.
    min_ndim: the axes a leaf a regex matches must have.

  Raises:
    TypeError: when `selector` is neither a string nor callable.
    ValueError: when the regex does not compile.
  """
  if callable(selector):
    chosen = selector
  elif isinstance(selector, str):
    maps.check_regex(field, selector)
    pattern = re.compile(selector)

    def chosen(name, leaf):
      return pattern.search(name) is not None and len(_shape(leaf)) >= min_ndim

  else:
    raise TypeError(
      f'{field}={selector!r}: expected a regex string or a predicate (name, leaf) -> bool.'
    )
  return lambda name, leaf: leaf is not None and math.prod(_shape(leaf)) > 0 and chosen(name, leaf)


def _shape(leaf: Any) -> tuple[int, ...]:
  """The shape of an array, a shape/dtype struct or a Python number."""
  shape = getattr(leaf, 'shape', None)
  return tuple(np.shape(leaf) if shape is None else shape)


def check_prunable(name: str, leaf: Any) -> None:
  """A ValueError naming the leaf unless it is real floating point."""
  dtype = np.dtype(leaf.dtype)
  if not jnp.issubdtype(dtype, jnp.floating):  # jnp's knows bfloat16
    raise ValueError(
      f'leaf {name!r} has dtype {dtype}: only real floating-point leaves can be pruned or '
      'trained sparse (by magnitude or gradient). Leave it out with weight_name_regex or a '
      'prune_filter, or cast the params to a float dtype.'
    )


def leaf_specs(
  params: PyTree, hparams: Any, prune_filter: PruneFilter | None = None, warn: bool = True
) -> PyTree:
  """A tree parallel to `params`: a LeafSpec for each pruned leaf, None for the rest.

  The pruned leaves are those `leaf_filter` picks (leaves with no elements never are).

  Args:
    params: the params tree (arrays or shape/dtype structs).
    hparams: a ConfigDict or `HParams`.
    prune_filter: `(name, leaf) -> bool` replacing `weight_name_regex`.
    warn: warn, naming leaves, when no leaf is pruned, about map entries that
      match no pruned leaf and about block dims that fall back to elementwise masks.

  Raises:
    ValueError: when one leaf matches several entries of a map, when a pruned
      leaf is not floating point, or when its layer axes leave each layer fewer
      than 2 axes (1 with a `prune_filter`, which may prune vectors).
  """
  h = hparams_lib.freeze(hparams)
  by_default_filter = prune_filter is None
  chosen = leaf_filter(h.weight_name_regex if prune_filter is None else prune_filter)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  named = [(leaf_name(path), leaf) for path, leaf in flat]
  picked = [chosen(name, leaf) for name, leaf in named]
  pruned = [name for (name, leaf), p in zip(named, picked, strict=True) if p]
  for (name, leaf), p in zip(named, picked, strict=True):
    if p:
      check_prunable(name, leaf)
  matched: dict[str, dict[str, Any]] = {}
  unmatched: list[str] = []
  for field, entries in (
    ('weight_sparsity_map', h.sparsity_entries),
    ('block_dims_map', h.block_entries),
    ('nm_sparsity_map', h.nm_entries),
    ('layer_axes_map', h.layer_entries),
  ):
    matched[field], missed = maps.match_entries(field, pruned, entries)
    unmatched += [f'{field} entry {regex!r}' for regex in missed]
  elementwise: list[str] = []

  def spec(name, leaf):
    target = matched['weight_sparsity_map'].get(name)
    dims = matched['block_dims_map'].get(name) or h.block_dims
    nm = matched['nm_sparsity_map'].get(name) or h.nm
    entry = matched['layer_axes_map'].get(name) or 0
    positions = _layer_positions(name, tuple(leaf.shape), entry)
    layer_axes = len(positions)
    _check_layer_axes(name, tuple(leaf.shape), layer_axes, by_default_filter)
    layer_at = () if positions == tuple(range(layer_axes)) else positions
    layer_shape = tuple(d for i, d in enumerate(leaf.shape) if i not in positions)
    resolved = resolve_block_dims(layer_shape, dims)
    if resolved is None and tuple(dims) != (1, 1) and nm is None:
      elementwise.append(f'{name} {layer_shape}')
    return LeafSpec(
      name=name,
      target=h.target_sparsity if target is None else target,
      block_dims=(1, 1) if resolved is None else resolved,
      nm=nm,
      layer_axes=layer_axes,
      layer_at=layer_at,
    )

  specs = jax.tree_util.tree_unflatten(
    treedef,
    [spec(name, leaf) if p else None for (name, leaf), p in zip(named, picked, strict=True)],
  )
  if warn:
    if not pruned:
      _warn_nothing_pruned(h, params, by_default_filter)
    maps.warn_unmatched(unmatched, pruned, 'pruned leaves')
    if elementwise:
      warnings_lib.warn(
        f'jaxprune: block dims apply to 2-D weights (after squeezing size-1 axes); these '
        f'pruned leaves are not 2-D and get elementwise masks: {elementwise}. Give them '
        '1x1 in block_dims_map, or leave them out of the block rule.'
      )
  return specs


def _layer_positions(
  name: str, shape: tuple[int, ...], entry: int | tuple[int, ...]
) -> tuple[int, ...]:
  """The leaf's layer axes, ascending, from its `layer_axes_map` value: a count of leading
  axes, or axis indices (negative ones count from the end)."""
  if isinstance(entry, int):
    return tuple(range(entry))
  written = f'@{"@".join(map(str, entry))}'
  for index in entry:
    if not -len(shape) <= index < len(shape):
      raise ValueError(
        f'layer_axes_map: leaf {name!r} of shape {shape} has no axis {index} (entry value '
        f'{written!r}): its axes are 0 to {len(shape) - 1}, or -{len(shape)} to -1 from the '
        "end. Give the stacked axis's index, or narrow the entry's regex to the stacked leaves."
      )
  positions = sorted(index % len(shape) for index in entry)
  if len(set(positions)) != len(positions):
    raise ValueError(
      f'layer_axes_map: leaf {name!r} of shape {shape}: entry value {written!r} names the '
      'same axis twice (an index and its negative form); name each layer axis once.'
    )
  return tuple(positions)


def _check_layer_axes(
  name: str, shape: tuple[int, ...], layer_axes: int, by_default_filter: bool
) -> None:
  """A leaf's layer axes must leave each layer a leaf that could be pruned on its own.

  `layer_axes_map` is for stacked leaves (`nn.scan`'s (layers, in, out)
  kernels): each layer is pruned as a separate variable would be. The default
  filter prunes leaves of 2 or more axes, so a layer of fewer is a mistake (an
  entry matching ordinary 2-D kernels, whose rows would each get a threshold).
  """
  left = len(shape) - layer_axes
  if left < 1 or (by_default_filter and left < 2):
    raise ValueError(
      f'layer_axes_map: leaf {name!r} of shape {shape} has {left} axes left after its '
      f'{layer_axes} layer axes, but each layer must be a weight of at least 2 axes: the '
      'map is for leaves stacked by nn.scan or nn.vmap, such as a (layers, in, out) '
      "kernel. Narrow the entry's regex to the stacked leaves."
    )


def _warn_nothing_pruned(h: hparams_lib.HParams, params: PyTree, by_default_filter: bool) -> None:
  """Warns, naming the leaves, when a params tree with weights gets no pruned leaf."""
  weights = [name for name, leaf in named_leaves(params) if getattr(leaf, 'ndim', 0) >= 2]
  if not weights:
    return
  shown = weights[:_SHOWN_NAMES] + (
    [f'... {len(weights) - _SHOWN_NAMES} more'] if len(weights) > _SHOWN_NAMES else []
  )
  selector = (
    f'weight_name_regex={h.weight_name_regex!r} (matched with re.search)'
    if by_default_filter
    else 'prune_filter'
  )
  warnings_lib.warn(
    f'jaxprune: {selector} selects none of the leaves, so nothing is pruned; the '
    f'leaves with 2 or more axes are {shown}. Make it match the names of the '
    'weights to prune.'
  )


def _is_spec(x: Any) -> bool:
  return isinstance(x, LeafSpec) or x is None


def spec_leaves(specs: PyTree) -> list[LeafSpec | None]:
  """The specs in the flattening order of the params (None for unpruned leaves)."""
  return jax.tree.leaves(specs, is_leaf=_is_spec)


def resolve_block_dims(
  shape: tuple[int, ...], block_dims: tuple[int, int]
) -> tuple[int, int] | None:
  """Resolves -1 against this variable's squeezed 2-D shape.

  Returns:
    (height, width) with -1 replaced by the full dimension, or None when the
    elementwise rule applies: dims (1, 1) or a squeezed shape that is not 2-D.
  """
  if tuple(block_dims) == (1, 1):
    return None
  squeezed = [d for d in shape if d != 1]
  if len(squeezed) != 2:
    return None
  # A block larger than its dimension is that dimension (same pooled values, no huge pad).
  return tuple(d if b == -1 else min(b, d) for b, d in zip(block_dims, squeezed, strict=True))
