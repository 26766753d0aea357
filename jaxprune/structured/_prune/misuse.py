"""First guesses at `prune` that would fail deep inside Flax or JAX, answered with the fix.

Each check runs before anything is traced (or, for a Linen module whose variables
do not fit its inputs, turns Flax's scope error into one line naming the value and
the call that works):

  unknown_keywords    `prune(..., sparsity=0.5)`: names `ratio` / `flops_target`, or
                      the keyword meant
  variables_first     `prune(model, x, variables)`: the variables go first
  linen_variables     Flax `params` where the module takes `{'params': params}`
  explained_trace     a Linen module whose variables lack a collection it reads
                      (`batch_stats`) or whose example inputs do not fit its params
  checked_loss        a Taylor `loss_fn` that raises or returns more than a scalar
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import numpy as np

# What users coming from unstructured pruning (or from Torch) call the target.
_TARGET_WORDS = ('sparsity', 'target_sparsity', 'amount', 'pruning_ratio', 'prune_ratio')


def unknown_keywords(given: Iterable[str], accepted: Iterable[str]) -> str | None:
  """The one-line TypeError message for keywords `prune` does not take, or None."""
  accepted = list(accepted)
  unknown = [name for name in given if name not in accepted]
  if not unknown:
    return None
  name = unknown[0]
  if name in _TARGET_WORDS:
    return (
      f'prune: no keyword {name}=; structured pruning takes ratio= (the fraction of '
      'channels to remove, e.g. prune(model, variables, x, ratio=0.5)) or flops_target= '
      '(the fraction of the FLOPs to keep).'
    )
  near = difflib.get_close_matches(name, accepted, n=1)
  hint = f'did you mean {near[0]}=? ' if near else ''
  return f'prune: no keyword {name}=; {hint}prune takes {", ".join(accepted)}.'


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))


def _shape(x: Any) -> str:
  return f'{np.dtype(x.dtype).name}{list(np.shape(x))}'


def variables_first(model: Any, variables: Any, example_args: tuple) -> None:
  """Refuses an array where the variables go when the variables are among the inputs
  (`prune(model, x, variables)`), or when the model is a Linen module."""
  if not _is_array(variables):
    return
  swapped = any(isinstance(a, Mapping) for a in example_args)
  if swapped or isinstance(model, nn.Module):
    raise TypeError(
      f'prune: got an array ({_shape(variables)}) where the variables go'
      + (' and the variables among the inputs' if swapped else '')
      + ': the variables come first, prune(model, variables, x, ...) as in model.apply '
      '(or prune(model, x, variables=variables, ...)).'
    )


def _linen_apply_of(fn: Any) -> nn.Module | None:
  """The Linen module whose `apply` `fn` is (`model.apply`, or a functools.partial of it)."""
  fn = getattr(fn, 'func', fn)
  module = getattr(fn, '__self__', None)
  return module if isinstance(module, nn.Module) and fn.__name__ == 'apply' else None


def linen_variables(model: Any, variables: Any) -> None:
  """Refuses a Linen module's bare params (the dict inside `{'params': ...}`), given
  with the module or with its `apply`."""
  module = model if isinstance(model, nn.Module) else _linen_apply_of(model)
  if module is None or not isinstance(variables, Mapping):
    return
  if 'params' not in variables:
    keys = ', '.join(repr(k) for k in list(variables)[:4])
    call = 'model' if module is model else 'model.apply'
    raise TypeError(
      f"prune: the variables have no 'params' collection (their keys: {keys}): a Linen "
      'module takes its variables as model.apply does; wrap the params, prune('
      f"{call}, {{'params': params}}, x, ...), with 'batch_stats' too if the model has "
      'BatchNorm.'
    )


def _said(error: Exception) -> str:
  """A Flax error's own sentence, without the link to its documentation page."""
  return str(error).split(' (https://', 1)[0].rstrip('.')


@contextlib.contextmanager
def explained_trace(model: Any, variables: Any, example_args: tuple) -> Iterator[None]:
  """Turns Flax's scope errors while tracing a Linen module into the fix."""
  if not isinstance(model, nn.Module):
    yield
    return
  try:
    yield
  except flax.errors.ScopeCollectionNotFound as e:
    said = _said(e)
    missing = re.search(r'collection "([^"]+)"', str(e))
    collection = missing.group(1) if missing else 'a collection'
    given = ', '.join(repr(k) for k in variables)
    raise ValueError(
      f'prune: the variables have {given}, and {type(model).__name__} also reads '
      f'{collection!r} ({said}); pass every collection model.init returned, prune(model, '
      'model.init(key, x), x, ...) or {..., ' + f'{collection!r}: ...}}.'
    ) from e
  except flax.errors.ScopeParamShapeError as e:
    said = _said(e)
    shapes = ', '.join(_shape(a) for a in jax.tree.leaves(example_args) if _is_array(a))
    raise ValueError(
      f'prune: the example inputs ({shapes}) do not fit the variables ({said}); give inputs '
      'shaped like those the model was initialised with (the channels too), or the '
      'variables of this model.'
    ) from e


def _described(tree: Any) -> str:
  """'(float32[2, 10], int32[2])': the shapes of a pytree's arrays, for an error."""
  leaves = jax.tree.leaves(tree)
  shown = [_shape(x) if hasattr(x, 'dtype') else type(x).__name__ for x in leaves[:4]]
  more = ', ...' if len(leaves) > 4 else ''
  return f'({", ".join(shown)}{more})'


def checked_loss(
  fn: Callable[..., Any],
  loss_fn: Callable[[Any, Any], Any],
  inputs: Callable[[Any], tuple],
) -> Callable[[Any, Any], Any]:
  """`loss(variables, batch)` for Taylor importance: `loss_fn(fn(variables, *inputs(batch)),
  batch)`, a failure of `loss_fn` or a loss that is not a scalar told in one line."""

  def loss(variables: Any, batch: Any) -> Any:
    args = inputs(batch)
    try:
      outputs = fn(variables, *args)
    except flax.errors.ScopeParamShapeError as e:
      shapes = ', '.join(_shape(a) for a in jax.tree.leaves(args) if _is_array(a))
      raise ValueError(
        f'Calibration.batches: the model inputs of a batch ({shapes}) do not fit the '
        f'variables ({_said(e)}); give batches shaped like the example inputs (the '
        'channels too), or Calibration(inputs=...) that maps a batch to them.'
      ) from e
    try:
      value = loss_fn(outputs, batch)
    except Exception as e:
      said = str(e).strip().splitlines()[0] if str(e).strip() else ''
      raise ValueError(
        f'Calibration.loss_fn(outputs, batch) raised {type(e).__name__}: {said}; it gets the '
        f'model outputs {_described(outputs)} and a batch as given {_described(batch)}, and '
        'returns a scalar loss, e.g. loss_fn=lambda logits, batch: '
        'optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean().'
      ) from e
    if np.ndim(value) != 0:
      raise ValueError(
        f'Calibration.loss_fn returned an array of shape {np.shape(value)}; return a scalar '
        'loss (e.g. its .mean()).'
      )
    return value

  return loss
