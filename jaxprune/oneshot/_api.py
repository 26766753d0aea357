"""`prune`: one-shot pruning of a trained model from calibration batches."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _names as names_lib
from jaxprune import _nm as nm_lib
from jaxprune.oneshot import _capture as capture
from jaxprune.oneshot import _solvers as solvers
from jaxprune.oneshot._layers import Layer, find_layers

PyTree = Any
Target = tuple[float, tuple[int, int] | None]   # (sparsity, nm)
METHODS = ('magnitude', 'wanda', 'sparsegpt')
_SHARED_STATS_LIMIT = 2 ** 26   # floats (256 MB in float32)


def _check_sparsity(where: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
    raise ValueError(f'{where}={value!r}: sparsity must be a number in [0, 1), e.g. 0.5.')
  return float(value)


def _target(where: str, sparsity: Any, nm: Any) -> Target | None:
  """(sparsity, nm) of a default or an override; None leaves the layer dense."""
  if nm is not None and sparsity is not None:
    raise ValueError(f'{where}: give a sparsity or an N:M pattern, not both '
                     f'(sparsity={sparsity!r}, nm={nm!r}).')
  if nm is not None:
    return 0.0, nm_lib.parse_nm(nm)
  if sparsity is None:
    return None
  sparsity = _check_sparsity(where, sparsity)
  return (sparsity, None) if sparsity > 0 else None


def _override(regex: str, value: Any) -> Target | None:
  where = f'overrides[{regex!r}]'
  if isinstance(value, (str, tuple)):
    try:
      return _target(where, None, value)
    except ValueError as err:
      raise ValueError(f'{where}: {err}') from None
  return _target(where, value, None)


def _targets(layers: list[Layer], default: Target | None,
             overrides: Mapping[str, Any]) -> dict[int, Target | None]:
  parsed = {}
  for regex, value in overrides.items():
    try:
      re.compile(regex)
    except re.error as err:
      raise ValueError(f'overrides: invalid regex {regex!r} ({err}).') from None
    parsed[regex] = _override(regex, value)
  targets, used = {}, set()
  for layer in layers:
    hits = [r for r in parsed if re.search(r, layer.name)]
    if len(hits) > 1:
      raise ValueError(f'overrides: layer {layer.name!r} matches several regexes {hits}; '
                       'make them exclusive.')
    used.update(hits)
    targets[layer.leaf] = parsed[hits[0]] if hits else default
  unused = [r for r in parsed if r not in used]
  if unused:
    raise ValueError(f'overrides: {unused} match no layer; the layers are '
                     f'{[layer.name for layer in layers]}.')
  return targets


def _matrix(leaf: jax.Array, in_axes: tuple[int, ...]) -> jax.Array:
  """The leaf as float32 (outputs, inputs): other axes first, then `in_axes` in order."""
  out_axes = tuple(a for a in range(leaf.ndim) if a not in in_axes)
  moved = jnp.transpose(leaf, out_axes + in_axes).astype(jnp.float32)
  inputs = int(np.prod([leaf.shape[a] for a in in_axes]))
  return moved.reshape(-1, inputs)


def _unmatrix(matrix: jax.Array, like: jax.Array, in_axes: tuple[int, ...]) -> jax.Array:
  out_axes = tuple(a for a in range(like.ndim) if a not in in_axes)
  perm = out_axes + in_axes
  moved = matrix.reshape([like.shape[a] for a in perm])
  return jnp.transpose(moved, np.argsort(perm))


def _check_nm(layers: list[Layer], leaves: list[Any], targets: dict) -> None:
  for layer in layers:
    target = targets[layer.leaf]
    if target is None or target[1] is None:
      continue
    inputs = int(np.prod([leaves[layer.leaf].shape[a] for a in layer.in_axes]))
    if inputs % target[1][1]:
      raise ValueError(
          f'nm={target[1][0]}:{target[1][1]}: layer {layer.name!r} has {inputs} inputs, not '
          f'divisible by M={target[1][1]}; choose an M dividing {inputs} or leave the layer '
          'out with overrides={regex: None}.')


def _as_function(fn: Any, params: PyTree) -> Callable[[PyTree, Any], Any]:
  """`fn(params, batch)`: a function as it is, or a Flax module (or its `apply`) called
  on `{'params': params}` (on `params` itself when it already holds a 'params' collection)."""
  module = getattr(fn, '__self__', None) if getattr(fn, '__name__', '') == 'apply' else fn
  try:
    from flax import linen
  except ImportError:  # pragma: no cover - flax is a dependency
    return fn
  if not isinstance(module, linen.Module):
    if not callable(fn):
      raise TypeError(f'fn={fn!r}: must be the model, as a function fn(params, batch) such as '
                      "lambda p, x: model.apply({'params': p}, x), or a Flax module.")
    return fn
  if isinstance(params, Mapping) and 'params' in params:
    return lambda variables, batch: module.apply(variables, batch)
  return lambda p, batch: module.apply({'params': p}, batch)


def _traced(fn: Callable, params: PyTree, batch: Any) -> Any:
  """The jaxpr of `fn(params, batch)`; an error inside `fn` in one line, with the cause."""
  try:
    return jax.make_jaxpr(fn)(params, batch)
  except Exception as err:  # the user's model failed on these arguments
    first = str(err).strip().splitlines()[0] if str(err).strip() else ''
    raise ValueError(
        f'oneshot.prune: fn(params, batch) raised {type(err).__name__}: {first[:300]}. fn '
        'must run the model on the params tree given and on one calibration batch, e.g. '
        "lambda p, x: model.apply({'params': p}, x); check the params and the batch's "
        'shape.') from err


def _batches(fn: Callable, params: PyTree, calibration_batches: Iterable[Any]) -> tuple:
  if hasattr(calibration_batches, 'shape') and hasattr(calibration_batches, 'dtype'):
    shape = tuple(calibration_batches.shape)
    raise ValueError(
        f'calibration_batches is one array of shape {shape}, which would be read as '
        f'{shape[0] if shape else 0} batches of one example each; pass a list of batches: '
        '[x] for one batch, or [x[i:i + 64] for i in range(0, len(x), 64)].')
  batches = list(calibration_batches)
  if not batches:
    raise ValueError('calibration_batches: one-shot pruning needs at least one calibration '
                     'batch (the inputs `fn(params, batch)` is called with).')
  for i, batch in enumerate(batches):
    for x in jax.tree.leaves(batch):
      x = np.asarray(x) if not isinstance(x, jax.Array) else x
      if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError(f'calibration_batches[{i}] holds NaN or Inf values; the statistics '
                         'of every layer would be NaN. Give finite calibration data.')
  closed = _traced(fn, params, batches[0])
  first = [jax.typeof(x) for x in jax.tree.leaves(batches[0])]
  for i, batch in enumerate(batches[1:], 1):
    avals = [jax.typeof(x) for x in jax.tree.leaves(batch)]
    if [(a.shape, a.dtype) for a in avals] != [(a.shape, a.dtype) for a in first]:
      raise ValueError(f'calibration_batches[{i}]: shapes {[a.str_short() for a in avals]} '
                       f'differ from batch 0 ({[a.str_short() for a in first]}); give '
                       'batches of one shape.')
  return closed, batches


def prune(fn: Callable[[PyTree, Any], Any], params: PyTree, calibration_batches: Iterable[Any],
          *, method: str, sparsity: float | None = None, nm: str | tuple[int, int] | None = None,
          overrides: Mapping[str, float | str | tuple[int, int] | None] | None = None,
          per_row: bool = False, blocksize: int = 128, percdamp: float = 0.01,
          sequential: bool = True) -> tuple[PyTree, PyTree]:
  """Prunes a trained model once, from calibration batches.

  The layers are the parameter leaves used only as a `dot_general` operand
  (docs/guides/oneshot.md); each is pruned along its input channels:

  * 'magnitude': keeps the largest |W| of the layer (`per_row=True`: of each
    output row, as Wanda compares); the batches serve only to trace `fn`.
  * 'wanda' (Sun et al. 2023, arXiv 2306.11695): keeps the largest
    |W_ij| * ||X_j||_2 within each output row; no weight update.
  * 'sparsegpt' (Frantar & Alistarh 2023, arXiv 2301.00774): layer-wise OBS
    reconstruction from H = 2 X^T X / n + percdamp * mean(diag H) I, columns in
    blocks of `blocksize`, adaptive mask per block (or per N:M group), the kept
    weights updated to compensate.

  With `sequential` (the papers' default) the layers go in waves
  (`layers.Layer.wave`): a wave's inputs are computed by the model whose
  earlier waves are already pruned. The Gram matrices and norms are
  accumulated over the batches inside `jit`, one wave at a time.

  Args:
    fn: the model: `fn(params, batch)`, or a Flax module (or its `apply`), then called
      as `model.apply({'params': params}, batch)` (as `model.apply(params, batch)` when
      `params` holds a 'params' collection).
    params: the trained parameters (a pytree of arrays; may be sharded).
    calibration_batches: an iterable of batches of one shape.
    method: 'magnitude', 'wanda' or 'sparsegpt'.
    sparsity: the share of each layer's weights to prune, in [0, 1).
    nm: an N:M pattern ('2:4' or (2, 4): keep N of every M consecutive inputs
      of each output), instead of `sparsity`.
    overrides: `{regex: sparsity | 'N:M' | None}` for the layers whose name
      (e.g. 'block_0/q/kernel') the regex matches (`re.search`); None or 0
      leaves them dense. Each regex must match a layer, each layer at most one.
    per_row: magnitude only: compare within each output row.
    blocksize: SparseGPT's column block (a multiple of M for N:M).
    percdamp: SparseGPT's dampening (0 only for a nonsingular Hessian).
    sequential: compute later layers' inputs with the earlier layers pruned.

  Returns:
    (params with pruned entries zero (and, for SparseGPT, the kept ones
    updated), masks): masks is a tree parallel to params, bool (True = kept)
    for the pruned layers, None elsewhere, as `jaxprune.apply_masks`,
    `jaxprune.strip`, `jaxprune.size_report` and `PruningState.masks` use.

  Raises:
    ValueError: for an unknown method, no batch, a sparsity outside [0, 1),
      an N:M pattern that does not divide a layer's inputs, a bad override, no
      layer found, or a singular Hessian with `percdamp=0`. Nothing is changed.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxprune import oneshot
    >>> params = {'w': jax.random.normal(jax.random.key(0), (8, 4))}
    >>> fn = lambda p, x: x @ p['w']
    >>> batches = [jax.random.normal(jax.random.key(1), (16, 8))]
    >>> pruned, masks = oneshot.prune(fn, params, batches, method='wanda', sparsity=0.5)
    >>> masks['w'].sum(axis=0)  # each output keeps half of its 8 inputs
    Array([4, 4, 4, 4], dtype=int32)
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}: choose one of {METHODS}.')
  default = _target('prune', sparsity, nm)
  if sparsity is None and nm is None:
    raise ValueError('prune: give sparsity=<share in [0, 1)> or nm=<N:M, e.g. "2:4">.')
  if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
    raise ValueError(f'blocksize={blocksize!r}: must be a positive integer, e.g. 128.')
  if not isinstance(percdamp, (int, float)) or not percdamp >= 0:
    raise ValueError(f'percdamp={percdamp!r}: must be >= 0, e.g. 0.01.')
  fn = _as_function(fn, params)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = [leaf for _, leaf in flat]
  closed, batches = _batches(fn, params, calibration_batches)
  layers = find_layers(closed, [names_lib.leaf_name(path) for path, _ in flat])
  if not layers:
    raise ValueError('prune: found no layer (a parameter leaf used only as a dot_general '
                     'operand) in fn; weights inside scan/while/cond are not seen.')
  targets = _targets(layers, default, overrides or {})
  for layer in layers:
    dtype = np.dtype(leaves[layer.leaf].dtype)
    if targets[layer.leaf] is not None and not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f'layer {layer.name!r} has dtype {dtype}: only floating-point weights '
                       'can be pruned; leave it dense with overrides={' + repr(layer.name)
                       + ': None} or convert the params to float.')
  _check_nm(layers, leaves, targets)
  for layer in layers:
    target = targets[layer.leaf]
    if method == 'sparsegpt' and target is not None and target[1] is not None:
      if blocksize % target[1][1]:
        raise ValueError(f'blocksize={blocksize}: must be a multiple of M={target[1][1]} '
                         f'for N:M (layer {layer.name!r}).')
  chosen = [layer for layer in layers if targets[layer.leaf] is not None]
  current = list(leaves)
  masks: list[Any] = [None] * len(leaves)
  kind = 'gram' if method == 'sparsegpt' else 'sqnorm'
  # One compiled pass measuring every layer, rerun per wave, unless the statistics of all
  # layers together would be large: then one pass per wave, measuring only its layers.
  shared = capture.stat_size(chosen, leaves, kind) <= _SHARED_STATS_LIMIT
  collect = capture.collector(closed, chosen, kind) if shared else None
  waves = sorted({layer.wave for layer in chosen}) if sequential else [None]
  for wave in waves:
    group = [layer for layer in chosen if not sequential or layer.wave == wave]
    stats = {}
    if method != 'magnitude':
      stats = (collect or capture.collector(closed, group, kind))(current, batches)
    for layer in group:
      current[layer.leaf], masks[layer.leaf] = _prune_layer(
          layer, current[layer.leaf], stats.get(layer.leaf), targets[layer.leaf], method,
          per_row=per_row, blocksize=blocksize, percdamp=float(percdamp))
  for i, leaf in enumerate(leaves):
    sharding = getattr(leaf, 'sharding', None)
    if masks[i] is not None and sharding is not None:
      current[i], masks[i] = jax.device_put((current[i], masks[i]), sharding)
  return jax.tree.unflatten(treedef, current), jax.tree.unflatten(treedef, masks)


@functools.partial(jax.jit, static_argnames=('in_axes', 'target', 'method', 'per_row',
                                             'blocksize', 'percdamp'))
def _prune_leaf(leaf: jax.Array, stat: Any, rows: Any, *, in_axes: tuple[int, ...],
                target: Target, method: str, per_row: bool, blocksize: int,
                percdamp: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(new leaf, mask, whether SparseGPT's H^-1 was finite) of one layer."""
  sparsity, nm = target
  w = _matrix(leaf, in_axes)
  finite = jnp.bool_(True)
  if method == 'magnitude':
    mask = solvers.magnitude(w, sparsity=sparsity, nm=nm, per_row=per_row)
    new = jnp.where(mask, w, 0.0)
  elif method == 'wanda':
    mask = solvers.wanda(w, stat, sparsity=sparsity, nm=nm)
    new = jnp.where(mask, w, 0.0)
  else:
    new, mask, finite = solvers.sparsegpt(
        w, solvers.hessian(stat, rows), sparsity=sparsity, nm=nm,
        blocksize=min(blocksize, w.shape[1]), percdamp=percdamp)
  return (_unmatrix(new, leaf, in_axes).astype(leaf.dtype), _unmatrix(mask, leaf, in_axes),
          finite)


def _prune_layer(layer: Layer, leaf: jax.Array, stat: Any, target: Target, method: str, *,
                 per_row: bool, blocksize: int, percdamp: float) -> tuple[jax.Array, jax.Array]:
  """(new leaf, mask) of one layer; a ValueError for a singular Hessian."""
  value, rows = stat if stat is not None else (None, 1)
  new, mask, finite = _prune_leaf(leaf, value, jnp.float32(rows), in_axes=layer.in_axes,
                                  target=target, method=method, per_row=per_row,
                                  blocksize=blocksize, percdamp=percdamp)
  if not bool(finite):
    raise ValueError(f'sparsegpt: the Hessian of the inputs of layer {layer.name!r} is '
                     f'singular (percdamp={percdamp}); set percdamp > 0, e.g. 0.01, or '
                     'calibrate on more tokens.')
  return new, mask
