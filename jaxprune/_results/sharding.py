"""Shardings of the pruning state for `jax.jit` with `NamedSharding` (multi-device, multi-host).

The pruning state shards like the params: each mask has the sharding of its
weight, and the thresholds and counters (scalars) are replicated. Under that
layout every threshold search is a chain of small all-reduces (a max, then a
count per candidate threshold) and the masks are computed where the weights
live, so one update gives bit for bit the masks, thresholds and pruned params
that one device gives.

    params_shardings = jax.tree.map(lambda p: NamedSharding(mesh, rule(p)), params)
    opt_shardings = jaxprune.state_shardings(jax.eval_shape(tx.init, params),
                                             params_shardings)
    step = jax.jit(train_step, in_shardings=(params_shardings, opt_shardings, batch_sharding),
                   out_shardings=(params_shardings, opt_shardings))
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxprune._results.summaries import find_pruning_state
from jaxprune._transform.transform import PruningState

PyTree = Any
KeyPath = tuple[Any, ...]


def _is_state(x: Any) -> bool:
  return isinstance(x, PruningState)


def _is_sharding_leaf(x: Any) -> bool:
  return isinstance(x, (jax.sharding.Sharding, PartitionSpec)) or x is None


def _named_shardings(params_shardings: PyTree, mesh: Mesh | None) -> tuple[PyTree, Mesh]:
  """`params_shardings` with PartitionSpecs made NamedShardings, and the mesh."""
  leaves = jax.tree.leaves(params_shardings, is_leaf=_is_sharding_leaf)
  for leaf in leaves:
    if leaf is not None and not isinstance(leaf, (NamedSharding, PartitionSpec)):
      raise TypeError(
        f'params_shardings has a leaf {leaf!r} of type {type(leaf).__name__}; '
        'expected NamedSharding or PartitionSpec leaves (build them with '
        'jax.sharding.NamedSharding(mesh, PartitionSpec(...))).'
      )
  if mesh is None:
    meshes = [leaf.mesh for leaf in leaves if isinstance(leaf, NamedSharding)]
    if not meshes:
      raise ValueError(
        'params_shardings holds only PartitionSpecs and mesh=None; pass '
        'mesh=... or NamedSharding leaves.'
      )
    mesh = meshes[0]
  named = jax.tree.map(
    lambda s: NamedSharding(mesh, s) if isinstance(s, PartitionSpec) else s,
    params_shardings,
    is_leaf=_is_sharding_leaf,
  )
  return named, mesh


def _fits(sharding: NamedSharding, leaf: Any) -> bool:
  """Whether `sharding` is a valid layout for an array shaped like `leaf`."""
  shape = getattr(leaf, 'shape', None)
  if shape is None or len(sharding.spec) > len(shape):
    return False
  try:
    sharding.shard_shape(tuple(shape))
  except ValueError:
    return False
  return True


def state_shardings(state: PyTree, params_shardings: PyTree, *, mesh: Mesh | None = None) -> PyTree:
  """The shardings of an optimizer state, given the shardings of the params.

  Every `PruningState` in `state`, at any depth of an optax chain or wrapper,
  gets masks sharded like their weights and replicated thresholds and
  counters. Any other leaf whose key path ends with a param's key path (adam's
  `mu`, `nu`, momentum traces, `MultiSteps` accumulators) gets that param's
  sharding when it fits the leaf's shape; everything else (step counts,
  hyperparameters, factored statistics) is replicated.

  Args:
    state: the state or its shapes, e.g. `jax.eval_shape(tx.init, params)`;
      a `PruningState` alone works too.
    params_shardings: a tree parallel to the params whose leaves are
      `NamedSharding`s (or `PartitionSpec`s together with `mesh`), or one
      sharding for all params.
    mesh: the mesh; by default that of the `NamedSharding` leaves.

  Returns:
    A tree of `NamedSharding`s parallel to `state` (None where the state has
    None), for `jax.jit`'s `in_shardings`/`out_shardings`, `jax.device_put`
    and `abstract_with_shardings` (orbax restore).
  """
  params_shardings, mesh = _named_shardings(params_shardings, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  flat, _ = jax.tree_util.tree_flatten_with_path(params_shardings, is_leaf=_is_sharding_leaf)
  by_path: dict[KeyPath, NamedSharding] = {tuple(path): s for path, s in flat}
  suffix_lengths = sorted({len(path) for path in by_path}, reverse=True)

  def pruning_shardings(pruning_state: PruningState) -> PruningState:
    # params_shardings may be a prefix of the params (one sharding for all of them).
    masks = jax.tree.map(
      lambda s, subtree: jax.tree.map(lambda _: s, subtree),
      params_shardings,
      pruning_state.masks,
      is_leaf=_is_sharding_leaf,
    )
    others = {
      field: jax.tree.map(lambda _: replicated, getattr(pruning_state, field))
      for field in PruningState._fields
      if field != 'masks'
    }
    return PruningState(masks=masks, **others)

  def leaf_sharding(path: KeyPath, leaf: Any) -> Any:
    if _is_state(leaf):
      return pruning_shardings(leaf)
    if leaf is None:
      return None
    for length in suffix_lengths:
      if length > len(path):
        continue
      sharding = by_path.get(tuple(path[len(path) - length :]))
      if sharding is not None and _fits(sharding, leaf):
        return sharding
    return replicated

  return jax.tree_util.tree_map_with_path(
    leaf_sharding, state, is_leaf=lambda x: _is_state(x) or x is None
  )


def pruning_state_shardings(
  state: PyTree, params_shardings: PyTree, *, mesh: Mesh | None = None
) -> PruningState:
  """The shardings of the one `PruningState` inside `state` (see `state_shardings`).

  Args:
    state: a `PruningState`, or an optax state (or its shapes) containing one.
    params_shardings: `NamedSharding`s (or `PartitionSpec`s with `mesh`) parallel
      to the params.
    mesh: the mesh; by default that of the `NamedSharding` leaves.

  Returns:
    A `PruningState` of shardings: masks like the params, the rest replicated.
  """
  return state_shardings(find_pruning_state(state), params_shardings, mesh=mesh)


def abstract_with_shardings(tree: PyTree, shardings: PyTree) -> PyTree:
  """`jax.ShapeDtypeStruct`s carrying `shardings`: the target of a sharded orbax restore.

  Args:
    tree: arrays or shapes (e.g. `jax.eval_shape(tx.init, params)`).
    shardings: a tree of shardings parallel to `tree` (e.g. from `state_shardings`).

  Returns:
    A tree parallel to `tree`; pass it to
    `orbax.checkpoint.args.StandardRestore(...)` so that each process reads
    only its own shards.
  """
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )
