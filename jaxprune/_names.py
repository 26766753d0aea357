"""Leaf names: a pytree key path joined with '/' (docs/explanation/semantics.md#names-and-maps)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

PyTree = Any


def _key_str(key: Any) -> str:
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return str(key.key)
  return str(key)


def leaf_name(path: Sequence[Any]) -> str:
  """Joins a key path with '/', dropping the trailing `value` of an NNX variable.

  Args:
    path: a key path as given by `jax.tree_util.tree_flatten_with_path`.

  Returns:
    The name, e.g. 'Dense_0/kernel' or 'encoder/layers_2/attention/query/kernel'.
  """
  parts = [_key_str(k) for k in path]
  if len(parts) > 1 and parts[-1] == 'value':
    parts = parts[:-1]
  return '/'.join(parts)


def tree_names(tree: PyTree) -> PyTree:
  """Returns a pytree parallel to `tree` whose leaves are the leaves' names."""
  return jax.tree_util.tree_map_with_path(lambda path, _: leaf_name(path), tree)


def named_leaves(tree: PyTree) -> list[tuple[str, Any]]:
  """Returns `[(name, leaf), ...]` in the flattening order of `tree`."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(leaf_name(path), leaf) for path, leaf in flat]
