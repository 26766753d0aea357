"""What `oneshot.prune` is given: the model, the calibration batches, the targets.

Each is checked before anything is traced or changed, and a mistake is one line
that names the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._checks import check_fraction
from jaxprune._config import maps as maps
from jaxprune._masks import nm as nm_lib
from jaxprune.oneshot._layers import Layer

PyTree = Any
Target = tuple[float, tuple[int, int] | None]  # (sparsity, nm)
METHODS = ('magnitude', 'wanda', 'sparsegpt', 'ria')


def parse_target(where: str, sparsity: Any, nm: Any) -> Target | None:
  """(sparsity, nm) of a default or an override; None leaves the layer dense."""
  if nm is not None and sparsity is not None:
    raise ValueError(
      f'{where}: give a sparsity or an N:M pattern, not both (sparsity={sparsity!r}, nm={nm!r}).'
    )
  if nm is not None:
    return 0.0, nm_lib.parse_nm(nm)
  if sparsity is None:
    return None
  check_fraction('sparsity', sparsity, where=where, example='0.5')
  sparsity = float(sparsity)
  return (sparsity, None) if sparsity > 0 else None


def parse_override(regex: str, value: Any) -> Target | None:
  """An `overrides` entry's target: a sparsity, an N:M pattern, or None (dense)."""
  where = f'overrides[{regex!r}]'
  if isinstance(value, (str, tuple)):
    try:
      return parse_target(where, None, value)
    except ValueError as err:
      raise ValueError(f'{where}: {err}') from None
  return parse_target(where, value, None)


def layer_key(layer: Layer) -> tuple[int, int | None]:
  """A layer's key: its leaf, and its slice for a slice of a stacked leaf."""
  return layer.leaf, layer.stack.index if layer.stack is not None else None


def layer_targets(
  layers: list[Layer], default: Target | None, overrides: Mapping[str, Any]
) -> dict[tuple[int, int | None], Target | None]:
  """Each layer's target: its override's, else the default (jaxprune's map rule,
  `maps.match_entries`: a layer matching two regexes is an error, a regex matching no
  layer a warning)."""
  parsed = {}
  for regex, value in overrides.items():
    maps.check_regex('overrides', regex)
    parsed[regex] = parse_override(regex, value)
  names = [layer.name for layer in layers]
  mapped, unmatched = maps.match_entries('overrides', names, parsed.items(), kind='layer')
  maps.warn_unmatched([f'overrides entry {regex!r}' for regex in unmatched], names, 'layers')
  return {layer_key(layer): mapped.get(layer.name, default) for layer in layers}


def check_nm(layers: list[Layer], leaves: list[Any], targets: dict) -> None:
  for layer in layers:
    target = targets[layer_key(layer)]
    if target is None or target[1] is None:
      continue
    inputs = int(np.prod([leaves[layer.leaf].shape[a] for a in layer.in_axes]))
    if inputs % target[1][1]:
      raise ValueError(
        f'nm={target[1][0]}:{target[1][1]}: layer {layer.name!r} has {inputs} inputs, not '
        f'divisible by M={target[1][1]}; choose an M dividing {inputs} or leave the layer '
        'out with overrides={regex: None}.'
      )


def check_conv_nm(layers: list[Layer], leaves: list[Any], targets: dict) -> None:
  """A convolution's N:M groups lie along its input features: M must divide them."""
  for layer in layers:
    target = targets[layer_key(layer)]
    if target is None or target[1] is None or not layer.sites[0].conv:
      continue
    features = leaves[layer.leaf].shape[layer.in_axes[-1]]
    if features % target[1][1]:
      raise ValueError(
        f'nm={target[1][0]}:{target[1][1]}: convolution {layer.name!r} has {features} input '
        f'features per group, not divisible by M={target[1][1]}; choose an M dividing '
        f'{features} or leave the layer out with overrides={{regex: None}}.'
      )


def model_function(fn: Any, params: PyTree) -> Callable[[PyTree, Any], Any]:
  """`fn(params, batch)`: a function as it is, or a Flax module (or its `apply`) called
  on `{'params': params}` (on `params` itself when it already holds a 'params' collection)."""
  module = getattr(fn, '__self__', None) if getattr(fn, '__name__', '') == 'apply' else fn
  try:
    from flax import linen
  except ImportError:  # pragma: no cover - flax is a dependency
    return fn
  if not isinstance(module, linen.Module):
    if not callable(fn):
      raise TypeError(
        f'fn={fn!r}: must be the model, as a function fn(params, batch) such as '
        "lambda p, x: model.apply({'params': p}, x), or a Flax module."
      )
    return fn
  if isinstance(params, Mapping) and 'params' in params:
    return lambda variables, *batch: module.apply(variables, *batch)
  return lambda p, *batch: module.apply({'params': p}, *batch)


def trace_model(fn: Callable, params: PyTree, batch: Any) -> Any:
  """The jaxpr of `fn(params, batch)`; an error inside `fn` in one line, with the cause."""
  try:
    return jax.make_jaxpr(fn)(params, batch)
  except Exception as err:  # the user's model failed on these arguments
    first = str(err).strip().splitlines()[0] if str(err).strip() else ''
    raise ValueError(
      f'oneshot.prune: fn(params, batch) raised {type(err).__name__}: {first[:300]}. fn '
      'must run the model on the params tree given and on one calibration batch, e.g. '
      "lambda p, x: model.apply({'params': p}, x); check the params and the batch's "
      'shape.'
    ) from err


def read_batches(fn: Callable, params: PyTree, calibration_batches: Iterable[Any]) -> tuple:
  if hasattr(calibration_batches, 'shape') and hasattr(calibration_batches, 'dtype'):
    shape = tuple(calibration_batches.shape)
    raise ValueError(
      f'calibration_batches is one array of shape {shape}, which would be read as '
      f'{shape[0] if shape else 0} batches of one example each; pass a list of batches: '
      '[x] for one batch, or [x[i:i + 64] for i in range(0, len(x), 64)].'
    )
  batches = list(calibration_batches)
  if not batches:
    raise ValueError(
      'calibration_batches: one-shot pruning needs at least one calibration '
      'batch (the inputs `fn(params, batch)` is called with).'
    )
  for i, batch in enumerate(batches):
    for x in jax.tree.leaves(batch):
      x = np.asarray(x) if not isinstance(x, jax.Array) else x
      if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError(
          f'calibration_batches[{i}] holds NaN or Inf values; the statistics '
          'of every layer would be NaN. Give finite calibration data.'
        )
  closed = trace_model(fn, params, batches[0])
  first = [jax.typeof(x) for x in jax.tree.leaves(batches[0])]
  for i, batch in enumerate(batches[1:], 1):
    avals = [jax.typeof(x) for x in jax.tree.leaves(batch)]
    if [(a.shape, a.dtype) for a in avals] != [(a.shape, a.dtype) for a in first]:
      raise ValueError(
        f'calibration_batches[{i}]: shapes {[a.str_short() for a in avals]} '
        f'differ from batch 0 ({[a.str_short() for a in first]}); give '
        'batches of one shape.'
      )
  return closed, batches
