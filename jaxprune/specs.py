"""Which leaves are pruned, and each one's target and block shape (SPEC section 6)."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from jaxprune import blocks
from jaxprune import hparams as hparams_lib
from jaxprune import nm as nm_lib
from jaxprune.names import leaf_name

PyTree = Any
PruneFilter = Callable[[str, Any], bool]


@dataclasses.dataclass(frozen=True)
class LeafSpec:
  """How one pruned leaf is pruned.

  Attributes:
    name: the leaf's name (key path joined with '/').
    target: its final sparsity (its `weight_sparsity_map` entry, else the global one).
    block_dims: (height, width) with -1 already resolved for this leaf's shape.
    nm: (n, m) for N:M sparsity along the input axis, or None.
  """
  name: str
  target: float
  block_dims: tuple[int, int]
  nm: tuple[int, int] | None = None


def default_filter(hparams: ml_collections.ConfigDict) -> PruneFilter:
  """Prunes leaves whose name matches `weight_name_regex` and that have ndim >= 2."""
  pattern = re.compile(hparams.weight_name_regex)
  return lambda name, leaf: bool(pattern.search(name)) and getattr(leaf, 'ndim', 0) >= 2


def _single_match(field: str, name: str, entries: list[tuple[str, Any]], used: set[str]) -> Any:
  matches = [(regex, value) for regex, value in entries if re.search(regex, name)]
  if len(matches) > 1:
    raise ValueError(f'{field}: leaf {name!r} matches several entries '
                     f'{[f"{r}:{v}" for r, v in matches]}; make the regexes exclusive.')
  if not matches:
    return None
  used.add(matches[0][0])
  return matches[0][1]


def _resolve_blocks(name: str, shape: tuple[int, ...], dims: tuple[int, int]) -> tuple[int, int]:
  resolved = blocks.resolve_block_dims(shape, dims)
  return (1, 1) if resolved is None else resolved


def leaf_specs(params: PyTree, hparams: ml_collections.ConfigDict,
               prune_filter: PruneFilter | None = None) -> PyTree:
  """A tree parallel to `params`: a LeafSpec for each pruned leaf, None for the rest.

  Raises ValueError when one leaf matches several entries of a map; warns about
  entries that match no pruned leaf.
  """
  hparams_lib.validate(hparams)
  prune_filter = prune_filter or default_filter(hparams)
  sparsities = hparams_lib.sparsity_map(hparams)
  block_entries = hparams_lib.block_dims_map(hparams)
  nm_entries = hparams_lib.nm_map(hparams)
  global_nm = nm_lib.parse_nm(hparams.sparsity_m_by_n)
  default_dims = (hparams.block_height, hparams.block_width)
  used: set[str] = set()

  def spec(path, leaf):
    name = leaf_name(path)
    if not prune_filter(name, leaf):
      return None
    target = _single_match('weight_sparsity_map', name, sparsities, used)
    dims = _single_match('block_dims_map', name, block_entries, used) or default_dims
    nm = _single_match('nm_sparsity_map', name, nm_entries, used) or global_nm
    return LeafSpec(
        name=name,
        target=hparams.target_sparsity if target is None else target,
        block_dims=_resolve_blocks(name, tuple(leaf.shape), dims),
        nm=nm)

  specs = jax.tree_util.tree_map_with_path(spec, params)
  all_regexes = [r for r, _ in sparsities + block_entries + nm_entries]
  unused = [r for r in all_regexes if r not in used]
  if unused:
    warnings.warn(f'jaxprune: map entries {unused} match no pruned leaf; pruned leaves are '
                  f'{[s.name for s in jax.tree.leaves(specs, is_leaf=_is_spec)]}.', stacklevel=3)
  return specs


def _is_spec(x: Any) -> bool:
  return isinstance(x, LeafSpec) or x is None


def spec_leaves(specs: PyTree) -> list[LeafSpec | None]:
  """The specs in the flattening order of the params (None for unpruned leaves)."""
  return jax.tree.leaves(specs, is_leaf=_is_spec)
