"""One-shot pruning of a model larger than the device: one block on the device at a time.

The blocks' params live on the host (numpy arrays) or in an orbax checkpoint. Block k
goes to the device, is pruned by `oneshot.prune` from the calibration activations it
receives, and goes back to the host; the activations then run through the pruned block
to become block k+1's inputs (SparseGPT's and Wanda's layer-by-layer order). So the
device holds one block's params, its statistics and the activations, whatever the depth.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune.oneshot import _api
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot._dsnot import DSnoT

PyTree = Any
Overrides = Mapping[str, float | str | tuple[int, int] | None]
# The arguments of `prune_offloaded` and `prune_checkpoint` that `oneshot.prune` takes as given.
_PASSED_ON = ('method', 'sparsity', 'nm', 'overrides', 'per_row', 'blocksize', 'percdamp', 'dsnot')


def prune_offloaded(
  block_fn: Callable[[PyTree, Any], Any],
  blocks: Sequence[PyTree] | PyTree,
  calibration_inputs: Iterable[Any],
  *,
  method: str,
  sparsity: float | None = None,
  nm: str | tuple[int, int] | None = None,
  overrides: Overrides | None = None,
  per_row: bool = False,
  blocksize: int = 128,
  percdamp: float = 0.01,
  dsnot: bool | DSnoT = False,
  stacked: bool = False,
) -> tuple[Any, Any]:
  """`oneshot.prune` of a stack of blocks whose params stay on the host: one block at a time
  on the device.

  Block k is put on the device, pruned by `oneshot.prune(block_fn, block_k, inputs_k, ...)`
  (its layers in waves, as the in-memory path prunes them), and copied back to the host;
  `inputs_{k+1}` are the pruned block's outputs on `inputs_k` (the layer-by-layer order of
  SparseGPT and Wanda). The masks and weights are those of `oneshot.prune` of the whole
  stack `x -> block_fn(block_n, ... block_fn(block_0, x))` (or its `lax.scan`) on the same
  inputs, bit for bit on the CPU.

  Args:
    block_fn: one block: `block_fn(block_params, x) -> x`, or a Flax module (or its `apply`).
    blocks: the blocks' params on the host: a list of per-block pytrees of numpy arrays
      or, with `stacked=True`, one pytree whose leaves stack the blocks along axis 0 (the
      params of Flax's `nn.scan`).
    calibration_inputs: the first block's inputs (e.g. the embedded calibration tokens),
      arrays of one shape.
    method, sparsity, nm, overrides, per_row, blocksize, percdamp, dsnot: as in
      `oneshot.prune`; an override's regex matches a layer's name within a block
      (e.g. 'up/kernel'), the same in every block.
    stacked: the blocks' leaves stacked along axis 0 instead of a list of blocks.

  Returns:
    (pruned blocks, masks) on the host as numpy arrays, laid out as `blocks`: masks are bool
    (True = kept) for the pruned layers, None elsewhere.

  Raises:
    ValueError: as `oneshot.prune`, and for no block, blocks of different trees, or stacked
      leaves of different lengths.

  Example:
    >>> import numpy as np
    >>> from jaxprune import oneshot
    >>> rng = np.random.default_rng(0)
    >>> blocks = [{'w': rng.normal(size=(8, 8)).astype(np.float32)} for _ in range(3)]
    >>> x = [rng.normal(size=(16, 8)).astype(np.float32)]
    >>> pruned, masks = oneshot.prune_offloaded(lambda p, x: x @ p['w'], blocks, x,
    ...                                         method='wanda', nm='2:4')
    >>> [int(m['w'].sum()) for m in masks]  # each block keeps 2 of every 4 inputs
    [32, 32, 32]
  """
  options = _passed_on(locals())
  count, block_at, treedef = _layout(blocks, stacked)
  pruned, masks = _stream(block_fn, count, block_at, calibration_inputs, options)
  return _assemble(pruned, treedef, stacked), _assemble(masks, treedef, stacked)


def prune_checkpoint(
  block_fn: Callable[[PyTree, Any], Any],
  path: str | os.PathLike,
  out_path: str | os.PathLike,
  calibration_inputs: Iterable[Any],
  *,
  like: PyTree,
  method: str,
  sparsity: float | None = None,
  nm: str | tuple[int, int] | None = None,
  overrides: Overrides | None = None,
  per_row: bool = False,
  blocksize: int = 128,
  percdamp: float = 0.01,
  dsnot: bool | DSnoT = False,
  stacked: bool = False,
) -> PyTree:
  """`prune_offloaded` of the blocks saved in an orbax checkpoint, written to a new one.

  The checkpoint at `path` holds the blocks as `prune_offloaded` takes them (saved with
  `orbax.checkpoint.PyTreeCheckpointer().save(path, blocks)`). A list of blocks is read
  one block at a time (orbax's partial restore); a stacked checkpoint is read to host
  memory whole. Nothing is written until every block is pruned; then the pruned blocks go
  to `out_path` by orbax's atomic save (a temporary folder renamed when complete), so a
  run that fails leaves no checkpoint at `out_path`, and `path` is never touched.

  Args:
    block_fn: one block, as in `prune_offloaded`.
    path: the checkpoint of the blocks to prune.
    out_path: where to write the pruned blocks; must not exist yet.
    calibration_inputs: the first block's inputs.
    like: the blocks' tree as the model has it (arrays or `jax.ShapeDtypeStruct`s, e.g.
      `jax.eval_shape` of the model's init, laid out as the checkpoint): the checkpoint
      must hold the same tree, shapes and dtypes.
    method, sparsity, nm, overrides, per_row, blocksize, percdamp, dsnot, stacked: as in
      `prune_offloaded`.

  Returns:
    The masks, on the host, laid out as the blocks (bool, None for leaves not pruned).

  Raises:
    ValueError: a missing checkpoint, one of another model (its tree, a shape or a dtype
      differs from `like`), an existing `out_path`, or `prune_offloaded`'s errors.
  """
  options = _passed_on(locals())
  import orbax.checkpoint as ocp

  path, out_path = os.path.abspath(os.fspath(path)), os.path.abspath(os.fspath(out_path))
  if not os.path.isdir(path):
    raise ValueError(
      f'prune_checkpoint: path={path!r} is not a checkpoint (no such folder); give the '
      'folder that orbax.checkpoint.PyTreeCheckpointer().save(path, blocks) wrote.'
    )
  if os.path.exists(out_path):
    raise ValueError(
      f'prune_checkpoint: out_path={out_path!r} exists; give a new path (a good checkpoint '
      'is never overwritten), or remove it first.'
    )
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    saved = checkpointer.metadata(path).item_metadata.tree
  except Exception as err:  # orbax's error for a folder that is not one of its checkpoints
    raise ValueError(
      f'prune_checkpoint: path={path!r} is not an orbax checkpoint ({type(err).__name__}); '
      'give the folder that orbax.checkpoint.PyTreeCheckpointer().save(path, blocks) wrote.'
    ) from None
  _check_matches(path, saved, like)
  count, block_at, treedef = _layout(like, stacked)
  if stacked:
    restored = checkpointer.restore(
      path,
      args=ocp.args.PyTreeRestore(
        item=like,
        restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), like),
      ),
    )
    count, block_at, treedef = _layout(restored, stacked)
  else:

    def block_at(k: int) -> PyTree:
      item = [None] * count
      item[k] = like[k]
      restore_args = [None] * count
      restore_args[k] = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), like[k])
      out = checkpointer.restore(
        path,
        args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
      )
      return out[k]

  pruned, masks = _stream(block_fn, count, block_at, calibration_inputs, options)
  checkpointer.save(out_path, _assemble(pruned, treedef, stacked))
  return _assemble(masks, treedef, stacked)


def _passed_on(arguments: Mapping[str, Any]) -> dict[str, Any]:
  """The `_PASSED_ON` entries of `arguments`: `locals()` on the first line of
  `prune_offloaded` or `prune_checkpoint`, which holds exactly their arguments."""
  return {name: arguments[name] for name in _PASSED_ON}


def _layout(blocks: Any, stacked: bool) -> tuple[int, Callable[[int], PyTree], Any]:
  """(number of blocks, block k's params, the tree of one block)."""
  if stacked:
    leaves, treedef = jax.tree.flatten(blocks)
    lengths = {_shape(leaf)[0] if _shape(leaf) else None for leaf in leaves}
    if not leaves or len(lengths) != 1 or None in lengths:
      raise ValueError(
        f'prune_offloaded: stacked=True needs leaves stacked along axis 0, one length for '
        f'all, got leading lengths {sorted(map(str, lengths))}; pass a list of blocks '
        'with stacked=False.'
      )
    return lengths.pop(), lambda k: jax.tree.unflatten(treedef, [a[k] for a in leaves]), treedef
  if not isinstance(blocks, (list, tuple)) or not blocks:
    raise ValueError(
      f'prune_offloaded: blocks={type(blocks).__name__}: give a non-empty list of per-block '
      'params, or stacked=True for leaves stacked along axis 0.'
    )
  treedef = jax.tree.structure(blocks[0])
  for k, block in enumerate(blocks):
    if jax.tree.structure(block) != treedef:
      raise ValueError(
        f'prune_offloaded: blocks[{k}] is another tree than blocks[0] '
        f'({jax.tree.structure(block)} vs {treedef}); every block must have the same params.'
      )
  return len(blocks), lambda k: blocks[k], treedef


def _stream(
  block_fn: Any, count: int, block_at: Callable[[int], PyTree], calibration: Any, options: dict
) -> tuple[list, list]:
  """Prunes blocks 0..count-1 in order; returns their pruned params and masks as numpy."""
  acts = [jax.device_put(batch) for batch in calibration]
  if not acts:
    raise ValueError('prune_offloaded: calibration_inputs is empty; give at least one batch.')
  fn = inputs.model_function(block_fn, block_at(0))
  forward = jax.jit(fn)
  pruned, masks, seen = [], [], {}
  for k in range(count):
    block = jax.device_put(block_at(k))
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      new, mask = _api.prune(fn, block, acts, **options)
    for w in caught:
      seen.setdefault(str(w.message), (k, w.category))
    del block
    if k + 1 < count:
      acts = [forward(new, x) for x in acts]
    # Copies: `np.asarray` of a CPU array is a view that keeps the device buffer alive.
    pruned.append(jax.tree.map(np.array, new))
    masks.append(jax.tree.map(np.array, mask))
    del new, mask
  # Once per message, not once per block: every block is the same function.
  for message, (k, category) in seen.items():
    warnings_lib.warn(f'prune_offloaded (first in block {k}): {message}', category)
  return pruned, masks


def _assemble(per_block: list, treedef: Any, stacked: bool) -> Any:
  """The per-block trees as the blocks were given: a list, or stacked along axis 0."""
  if not stacked:
    return per_block
  is_none = lambda x: x is None  # a leaf left dense has a None mask in every block
  columns = zip(*(jax.tree.leaves(b, is_leaf=is_none) for b in per_block), strict=True)
  return jax.tree.unflatten(treedef, [None if col[0] is None else np.stack(col) for col in columns])


def _check_matches(path: str, saved: PyTree, like: PyTree) -> None:
  """A ValueError naming the path when the checkpoint's tree is not the model's."""
  fix = 'give the checkpoint of this model, or a like= tree of the model that saved it'
  if jax.tree.structure(saved) != jax.tree.structure(like):
    raise ValueError(
      f'prune_checkpoint: path={path!r} holds another tree than like= '
      f'({jax.tree.structure(saved)} vs {jax.tree.structure(like)}); {fix}.'
    )
  names = jax.tree_util.tree_flatten_with_path(like)[0]
  for (key, want), got in zip(names, jax.tree.leaves(saved), strict=True):
    if tuple(got.shape) != _shape(want) or np.dtype(got.dtype) != np.dtype(want.dtype):
      raise ValueError(
        f'prune_checkpoint: path={path!r} holds {jax.tree_util.keystr(key)} of shape '
        f'{tuple(got.shape)} {np.dtype(got.dtype)}, the model {_shape(want)} '
        f'{np.dtype(want.dtype)}; {fix}.'
      )


def _shape(x: Any) -> tuple[int, ...]:
  """The shape of an array or a `jax.ShapeDtypeStruct`."""
  return tuple(getattr(x, 'shape', np.shape(x)))
