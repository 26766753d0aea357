"""`prune`: one-shot pruning of a trained model from calibration batches.

`prune` and `prune_with_report` each declare the same keywords, so that they show in both
signatures, and hand them all to `_run` by name: on their first line, `locals()` holds
exactly their arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _names as names_lib
from jaxprune import _warnings as warnings_lib
from jaxprune.oneshot import _capture as capture
from jaxprune.oneshot import _dsnot, _owl
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot import _layer_prune as layer_prune
from jaxprune.oneshot import _reorder as reorder
from jaxprune.oneshot import _waves as waves_lib
from jaxprune.oneshot._dsnot import DSnoT
from jaxprune.oneshot._layers import Layer, layers_and_reasons
from jaxprune.oneshot._owl import OWL
from jaxprune.oneshot._report import LayerReport, Report, short_message

PyTree = Any
Target = inputs.Target
METHODS = inputs.METHODS
_SHARED_STATS_LIMIT = 2**26  # floats (256 MB in float32)


def prune(
  fn: Callable[[PyTree, Any], Any],
  params: PyTree,
  calibration_batches: Iterable[Any],
  *,
  method: str,
  sparsity: float | None = None,
  nm: str | tuple[int, int] | None = None,
  overrides: Mapping[str, float | str | tuple[int, int] | None] | None = None,
  per_row: bool = False,
  blocksize: int = 128,
  percdamp: float = 0.01,
  sequential: bool | str = True,
  owl: bool | OWL = False,
  dsnot: bool | DSnoT = False,
  permute: bool | str = False,
) -> tuple[PyTree, PyTree]:
  r"""Prunes a trained model once, from calibration batches.

  The layers are the parameter leaves used only as a `dot_general` operand or
  a convolution kernel (docs/guides/oneshot.md), and each slice of a leaf
  stacked along a `lax.scan`'s steps whose slice the scan's body uses so (the
  blocks of Flax's `nn.scan`, haiku's `layer_stack`, a scan over an equinox
  model's stacked blocks); each is pruned along its input channels:

  * 'magnitude': keeps the largest |W| of the layer (`per_row=True`: of each
    output row, as Wanda compares); the batches serve only to trace `fn`.
  * 'wanda' (Sun et al. 2023, arXiv 2306.11695): keeps the largest
    |W_ij| * ||X_j||_2 within each output row; no weight update.
  * 'sparsegpt' (Frantar & Alistarh 2023, arXiv 2301.00774): layer-wise OBS
    reconstruction from H = 2 X^T X / n + percdamp * mean(diag H) I, columns in
    blocks of `blocksize`, adaptive mask per block (or per N:M group), the kept
    weights updated to compensate.
  * 'ria' (Zhang et al., ICLR 2024, "Plug-and-Play"): keeps the largest relative
    importance and activations `(|W_ij| / sum_k |W_ik| + |W_ij| / sum_k |W_kj|) *
    ||X_j||_2 ** 0.5` of the layer (`per_row=True`: of each output row); no update.

  `owl` (Yin et al. 2023, arXiv 2310.05175) sets the layers' sparsities from their
  outliers instead of the same `sparsity` for all: a layer with more Wanda scores above
  `m` times its mean gets a lower sparsity, the layers spread over `2 * lam`, the share of
  all their weights pruned `sparsity`. `dsnot` (Zhang et al. 2023, arXiv 2310.08915)
  then swaps pruned and kept weights within each output row to bring the row's expected
  output back towards the dense one's. `permute` reorders channels before N:M pruning
  (docs/guides/oneshot.md).

  A convolution is the matmul of its kernel with the unfolded input patches
  (inputs ordered as the kernel's spatial axes, then its input features, so
  that N:M groups lie along the input features; a grouped convolution's
  groups have their own statistics). With `sequential` (the papers' default)
  the layers go in waves (`oneshot.Layer.wave`): a wave's inputs are computed
  by the model whose earlier waves are already pruned; a stack's slices come
  in the order its scan runs them. The Gram matrices and norms are accumulated
  over the batches inside `jit`, one wave at a time (a stack's: one slice's).

  Weights it cannot prune (a leaf with two axes longer than 1 read by a gather,
  inside `while` or `cond`, by two products contracting different axes, as a
  scan's const or carry, ...) are named, with the reason, in one `UserWarning`.

  Args:
    fn: the model: `fn(params, batch)`, or a Flax module (or its `apply`), then called
      as `model.apply({'params': params}, batch)` (as `model.apply(params, batch)` when
      `params` holds a 'params' collection).
    params: the trained parameters (a pytree of arrays; may be sharded).
    calibration_batches: an iterable of batches of one shape.
    method: 'magnitude', 'wanda', 'sparsegpt' or 'ria'.
    sparsity: the share of each layer's weights to prune, in [0, 1).
    nm: an N:M pattern ('2:4' or (2, 4): keep N of every M consecutive inputs
      of each output), instead of `sparsity`.
    overrides: `{regex: sparsity | 'N:M' | None}` for the layers whose name
      (e.g. 'block_0/q/kernel', 'blocks/up/kernel[3]' for a stack's slice 3) the
      regex matches (`re.search`); None or 0 leaves them dense. A layer matching
      two regexes is an error, a regex matching no layer a warning (the rule of
      every map in jaxprune).
    per_row: magnitude and RIA: compare within each output row.
    blocksize: SparseGPT's column block (a multiple of M for N:M).
    percdamp: SparseGPT's dampening (0 only for a nonsingular Hessian).
    sequential: compute later layers' inputs with the earlier layers pruned: True
      layer by layer (each wave), False never (all on the dense model's inputs), or a
      regex naming blocks (a layer's block is the regex's first match in its name,
      e.g. r'^layers_\d+/'; r'\[\d+\]$' for a scanned stack's slices): block by block,
      each block's layers measured together on inputs computed with the earlier blocks
      pruned and this one dense, as the Wanda, OWL and RIA code does (a layer the regex
      does not match is a block of its own).
    owl: True or `oneshot.OWL(m=5, lam=0.08)`: OWL's layer-wise sparsities for the
      layers that take `sparsity` (not those `overrides` sets); not with `nm`.
    dsnot: True or `oneshot.DSnoT(max_cycle=50, threshold=5e-5)`: DSnoT's mask fix-up
      after the method, each row keeping its count of zeros.
    permute: True (every N:M layer) or a regex (the N:M layers whose name it matches):
      first reorder each such layer's input channels to keep more of its score under
      N:M, and the same channels in every other weight that holds them (the producer's
      outputs, biases, norms' scales: `oneshot.permute_channels`), so the model computes
      the same function. The params returned are in the new order.

  Returns:
    (params with pruned entries zero (and, for SparseGPT, the kept ones
    updated), masks): masks is a tree parallel to params, bool (True = kept)
    for the pruned layers, None elsewhere, as `jaxprune.apply_masks`,
    `jaxprune.strip`, `jaxprune.size_report` and `PruningState.masks` use.
    `prune_with_report` also gives what was pruned and each layer's
    reconstruction error.

  Raises:
    ValueError: for an unknown method, no batch, a sparsity outside [0, 1),
      an N:M pattern that does not divide a layer's inputs (a convolution's
      input features), a bad override, no layer found, or a singular Hessian
      with `percdamp=0`, `owl` with `nm` or a `lam` outside [0, min(sparsity,
      1 - sparsity)], or a layer to prune holding NaN or Inf weights. Nothing is
      changed.

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
  pruned, masks, _ = _run(**locals(), report=False)
  return pruned, masks


def prune_with_report(
  fn: Callable[[PyTree, Any], Any],
  params: PyTree,
  calibration_batches: Iterable[Any],
  *,
  method: str,
  sparsity: float | None = None,
  nm: str | tuple[int, int] | None = None,
  overrides: Mapping[str, float | str | tuple[int, int] | None] | None = None,
  per_row: bool = False,
  blocksize: int = 128,
  percdamp: float = 0.01,
  sequential: bool | str = True,
  owl: bool | OWL = False,
  dsnot: bool | DSnoT = False,
  permute: bool | str = False,
) -> tuple[PyTree, PyTree, Report]:
  """`prune`, and a `Report` of what it did: each pruned layer in order (its target, the
  share of its weights now zero, and its reconstruction error
  `||W X - W' X||^2 / ||W X||^2` on the calibration inputs it was pruned from), and the
  weights left dense with the reason.

  The same params and masks as `prune` with the same arguments; measuring the error
  needs each layer's Gram matrix `X^T X` (for 'magnitude' too, which then runs the
  calibration passes it otherwise skips). `print(report)` gives a table.

  Example:
    >>> import jax
    >>> from jaxprune import oneshot
    >>> params = {'w': jax.random.normal(jax.random.key(0), (8, 4))}
    >>> batches = [jax.random.normal(jax.random.key(1), (16, 8))]
    >>> _, _, report = oneshot.prune_with_report(lambda p, x: x @ p['w'], params, batches,
    ...                                          method='sparsegpt', nm='2:4')
    >>> [(layer.name, layer.shape, layer.target, layer.sparsity) for layer in report.layers]
    [('w', (4, 8), '2:4', 0.5)]
  """
  return _run(**locals(), report=True)


def _skipped(
  layers: list[Layer],
  reasons: Mapping[int, tuple[str, int | None]],
  leaves: list[Any],
  names: list[str],
) -> list[tuple[str, str]]:
  """(name, reason) of the used leaves that look like weights (floating, with two axes
  longer than 1 in what the model multiplies: a stack's slice for a stacked leaf) but are
  not layers."""
  found = {layer.leaf for layer in layers}
  out = []
  for leaf, (reason, stacked) in sorted(reasons.items()):
    shape = [n for a, n in enumerate(np.shape(leaves[leaf])) if a != stacked]
    if (
      leaf not in found
      and sum(n > 1 for n in shape) >= 2
      and jnp.issubdtype(np.dtype(leaves[leaf].dtype), jnp.floating)
    ):
      out.append((names[leaf], reason))
  return out


def _listing(skipped: list[tuple[str, str]]) -> str:
  return '; '.join(f'{name!r} ({reason})' for name, reason in skipped)


def _run(
  fn,
  params,
  calibration_batches,
  *,
  method,
  sparsity,
  nm,
  overrides,
  per_row,
  blocksize,
  percdamp,
  sequential,
  owl,
  dsnot,
  permute,
  report,
) -> tuple[PyTree, PyTree, Report]:
  """`prune_with_report`; with `report=False` the error is not measured (NaN)."""
  if method not in METHODS:
    raise ValueError(f'method={method!r}: choose one of {METHODS}.')
  default = inputs.parse_target('prune', sparsity, nm)
  if sparsity is None and nm is None:
    raise ValueError('prune: give sparsity=<share in [0, 1)> or nm=<N:M, e.g. "2:4">.')
  if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
    raise ValueError(f'blocksize={blocksize!r}: must be a positive integer, e.g. 128.')
  if not isinstance(percdamp, (int, float)) or not percdamp >= 0:
    raise ValueError(f'percdamp={percdamp!r}: must be >= 0, e.g. 0.01.')
  owl = _option('owl', owl, OWL)
  dsnot = _option('dsnot', dsnot, DSnoT)
  if owl is not None:
    if default is None or default[1] is not None:
      raise ValueError(
        f'owl={owl!r}: OWL sets unstructured sparsities, so it needs sparsity=<share in '
        f'(0, 1)>, not nm={nm!r} (N:M keeps the same share in every layer); leave out owl.'
      )
    _owl.check(owl, default[0])
  if dsnot is not None:
    _dsnot.check(dsnot)
  fn = inputs.model_function(fn, params)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = [leaf for _, leaf in flat]
  names = [names_lib.leaf_name(path) for path, _ in flat]
  closed, batches = inputs.read_batches(fn, params, calibration_batches)
  layers, reasons = layers_and_reasons(closed, names)
  skipped = _skipped(layers, reasons, leaves, names)
  if not layers:
    raise ValueError(
      'prune: found no layer (a parameter leaf used only as a dot_general '
      'operand or a convolution kernel) in fn' + (f': {_listing(skipped)}.' if skipped else '.')
    )
  if skipped:
    warnings_lib.warn(
      f'oneshot.prune leaves {len(skipped)} weight(s) dense, which it cannot '
      f'prune: {_listing(skipped)}.'
    )
  targets = inputs.layer_targets(layers, default, overrides or {})
  for layer in layers:
    dtype = np.dtype(leaves[layer.leaf].dtype)
    if targets[inputs.layer_key(layer)] is not None and not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(
        f'layer {layer.name!r} has dtype {dtype}: only floating-point weights '
        'can be pruned; leave it dense with overrides={'
        + repr(layer.name)
        + ': None} or convert the params to float.'
      )
  inputs.check_nm(layers, leaves, targets)
  inputs.check_conv_nm(layers, leaves, targets)
  for layer in layers:
    target = targets[inputs.layer_key(layer)]
    if method == 'sparsegpt' and target is not None and target[1] is not None:
      if blocksize % target[1][1]:
        raise ValueError(
          f'blocksize={blocksize}: must be a multiple of M={target[1][1]} '
          f'for N:M (layer {layer.name!r}).'
        )
  chosen = [layer for layer in layers if targets[inputs.layer_key(layer)] is not None]
  waves_lib.check_sequential(sequential, chosen)
  for layer in chosen:
    _check_finite(layer, layer_prune.weight(layer, leaves[layer.leaf]))
  permutations: tuple = ()
  if permute is not False and permute is not None:
    leaves, permutations = reorder.permuted(
      fn, params, leaves, names, closed, batches, chosen, targets, method, permute
    )
  outliers: dict[tuple, float] = {}
  if owl is not None:
    # The layers that take the default (an override's target is a new tuple, never it).
    spread = [layer for layer in chosen if targets[inputs.layer_key(layer)] is default]
    shares, outliers = _owl.allocate(closed, spread, leaves, batches, default[0], owl)
    targets.update(shares)
  kinds = {
    'magnitude': (),
    'wanda': ('sqnorm',),
    'sparsegpt': ('gram',),
    'ria': ('sqnorm',),
  }[method]
  if dsnot is not None:
    kinds = tuple(dict.fromkeys(kinds + ('sqnorm', 'sum', 'gram')))
  if report and 'gram' not in kinds:
    kinds += ('gram',)
  current = list(leaves)
  masks: list[Any] = [None] * len(leaves)
  # One compiled pass measuring every layer, rerun per wave, unless the statistics of all
  # layers together would be large: then one pass per wave, measuring only its layers (one
  # compiled pass per set of leaves: the waves of a stack's slices share theirs).
  shared = capture.stat_size(chosen, leaves, kinds) <= _SHARED_STATS_LIMIT
  collectors: dict[Any, Callable] = {}

  def measure(group: list[Layer], at: dict) -> dict:
    key = () if shared else tuple(sorted({layer.leaf for layer in group}))
    if key not in collectors:
      collectors[key] = capture.collector(closed, chosen if shared else group, kinds)
    return collectors[key](current if sequential else leaves, batches, at)

  records, short = [], []
  for group in waves_lib.passes(chosen, sequential):
    for part, at in capture.rounds(group):
      stats = measure(group, at) if kinds else {}
      for layer in part:
        target = targets[inputs.layer_key(layer)]
        if method != 'magnitude' or dsnot is not None:
          _check_inputs_seen(layer, stats.get(layer.leaf), method)
        new, mask, error = layer_prune.prune_layer(
          layer,
          layer_prune.weight(layer, current[layer.leaf]),
          stats.get(layer.leaf),
          target,
          method,
          per_row=per_row,
          blocksize=blocksize,
          percdamp=float(percdamp),
          with_error=report,
          dsnot=dsnot,
        )
        current[layer.leaf], masks[layer.leaf] = layer_prune.put(
          layer, current[layer.leaf], masks[layer.leaf], new, mask
        )
        if target[1] is None and int(jnp.sum(~mask)) != round(target[0] * mask.size):
          short.append((layer.name, float(1 - jnp.mean(mask)), f'{100 * target[0]:g}%'))
        records.append(
          LayerReport(
            layer.name,
            layer_prune.matrix_shape(layer, leaves[layer.leaf]),
            f'{target[1][0]}:{target[1][1]}' if target[1] else f'{100 * target[0]:g}%',
            float(1 - jnp.mean(mask)),
            layer.wave,
            error,
            outliers.get(inputs.layer_key(layer)),
          )
        )
  if short:
    warnings_lib.warn(short_message(short))
  for i, leaf in enumerate(leaves):
    sharding = getattr(leaf, 'sharding', None)
    if masks[i] is not None and sharding is not None:
      current[i], masks[i] = jax.device_put((current[i], masks[i]), sharding)
  return (
    jax.tree.unflatten(treedef, current),
    jax.tree.unflatten(treedef, masks),
    Report(tuple(records), tuple(skipped), tuple(short), permutations),
  )


def _check_finite(layer: Layer, weight: jax.Array) -> None:
  """A ValueError when the layer's weight holds NaN or Inf: no rule can rank those (each
  method would keep or drop them by accident), so every method refuses them alike."""
  bad = int(jnp.sum(~jnp.isfinite(weight)))
  if bad:
    raise ValueError(
      f'oneshot.prune: layer {layer.name!r} holds {bad} NaN or Inf weight(s), which no '
      'method can rank; replace them (e.g. jax.tree.map(jnp.nan_to_num, params)) or leave '
      f'the layer dense with overrides={{{layer.name!r}: None}}.'
    )


def _check_inputs_seen(layer: Layer, stat: Any, method: str) -> None:
  """A ValueError when the calibration batches gave the layer no input row (a convolution
  whose window is larger than its padded input has no output position): the method would
  rank its weights by nothing."""
  if stat is not None and int(stat[1]) == 0:
    raise ValueError(
      f'oneshot.prune: layer {layer.name!r} multiplied no input on the calibration batches '
      '(a convolution whose window is larger than its padded input has no output '
      f'position), so method={method!r} has nothing to rank its weights by; calibrate on '
      f"larger inputs, use method='magnitude', or leave it dense with "
      f'overrides={{{layer.name!r}: None}}.'
    )


def _option(field: str, value: Any, kind: type) -> Any:
  """An option given as False/None (off), True (its defaults) or its config object."""
  if value is None or value is False:
    return None
  if value is True:
    return kind()
  if not isinstance(value, kind):
    raise ValueError(
      f'{field}={value!r}: give True, False or oneshot.{kind.__name__}(...), '
      f'e.g. {field}=oneshot.{kind.__name__}().'
    )
  return value
