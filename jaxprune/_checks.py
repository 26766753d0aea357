"""Checks of arguments that several parts of jaxprune take: one rule and one message each."""

from __future__ import annotations

from typing import Any

import numpy as np

FRACTION_RULE = 'must be in [0, 1)'


def is_fraction(value: Any) -> bool:
  """Whether `value` is a real number, or an array of them, in [0, 1).

  A bool, a string, NaN and anything that is not a number are not. Traced values
  cannot be checked: callers skip them.
  """
  try:
    array = np.asarray(value)
  except (TypeError, ValueError):
    return False
  if array.dtype.kind not in 'iuf':  # bool ('b'), strings and objects are not numbers
    return False
  return bool(np.all((array >= 0) & (array < 1)))


def check_fraction(name: str, value: Any, *, where: str = '', example: str = '') -> None:
  """A ValueError unless `value` is in [0, 1): a sparsity, a drop fraction, a decay.

  The one check of that range: jaxprune's hyperparameters, `update_mask`, the maps,
  `jaxprune.sparse` and `jaxprune.oneshot` all call it.

  Args:
    name: the argument's name, e.g. 'sparsity'.
    value: its value (a number, or an array for `update_mask`).
    where: what takes it, prefixed to the message, e.g. 'update_mask'.
    example: a good value, e.g. '0.9', shown in the message.

  Raises:
    ValueError: '[<where>: ]<name>=<value>: must be in [0, 1)[, e.g. <example>].'
  """
  if not is_fraction(value):
    prefix = f'{where}: ' if where else ''
    hint = f', e.g. {example}' if example else ''
    raise ValueError(f'{prefix}{name}={value!r}: {FRACTION_RULE}{hint}.')


def need_params(params: Any, what: str) -> Any:
  """`params`, or a ValueError naming `what` when an optax update was called without them.

  Every jaxprune transform needs them: the masks are applied by turning the update of a
  pruned weight into `-params`.
  """
  if params is None:
    raise ValueError(f'{what} needs the params: call tx.update(grads, state, params).')
  return params
