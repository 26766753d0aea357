"""The rules of single hyperparameter fields: their types and ranges, each with its message.

`jaxprune._config.hparams.check_value` applies them; `HParams` applies the rules between fields,
`check_window` and `check_nm_alone`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxprune._checks import FRACTION_RULE, is_fraction
from jaxprune._config import schedule as schedule
from jaxprune._config.fields import Fields
from jaxprune._numerics import INT32_MAX, MAX_NBINS

POOLING = ('AVG', 'MAX')
THRESHOLD_METHODS = ('histogram', 'exact')
MASK_SOURCES = ('updated', 'params')
MASK_SEARCHES = ('auto', 'fixed', 'adaptive')


def typed_value(field: str, value: Any, default: Any) -> Any:
  """The value as the type of the field's `default`, or a ValueError naming both."""
  if isinstance(default, bool):
    if isinstance(value, (bool, np.bool_)):
      return bool(value)
    raise ValueError(f'{field}={value!r}: must be True or False (default {default}).')
  if isinstance(default, int):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
      check_rule(
        -INT32_MAX - 1 <= value <= INT32_MAX,
        field,
        value,
        'must fit in int32 (steps and sizes are int32 arrays inside jit)',
      )
      return int(value)
    raise ValueError(f'{field}={value!r}: must be an integer (default {default}).')
  if isinstance(default, float):
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
      value, (bool, np.bool_)
    ):
      check_rule(math.isfinite(value), field, value, 'must be a finite number')
      return float(value)
    raise ValueError(f'{field}={value!r}: must be a number (default {default}).')
  if isinstance(default, str):
    if isinstance(value, str):
      return value
    raise ValueError(f'{field}={value!r}: must be a string (default {default!r}).')
  if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
    return tuple(value)
  raise ValueError(
    f'{field}={value!r}: must be a list of "regex:value" strings (default {list(default)!r}).'
  )


def check_rule(condition: bool, field: str, value: Any, rule: str) -> None:
  if not condition:
    raise ValueError(f'{field}={value!r}: {rule}.')


# The rules of single fields (docs/explanation/semantics.md#hyperparameters, and the limits of
# int32 / float32 arithmetic); the rules between fields are `check_window` and `check_nm_alone`.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
  'name': (
    (lambda v: v.strip() != ''),
    "must not be empty: it prefixes every summary ('<name>/sparsity'); the default "
    "is 'model_pruning'",
  ),
  'weight_name_regex': (
    (lambda v: v != ''),
    'must not be empty: an empty regex matches every leaf name; give '
    "the leaves to prune, e.g. '(kernel|embedding)$' (the default), or "
    "'.' for every leaf with 2 or more axes",
  ),
  'begin_pruning_step': ((lambda v: v >= 0), 'must be >= 0'),
  'sparsity_function_begin_step': ((lambda v: v >= 0), 'must be >= 0'),
  'sparsity_function_exponent': (
    (lambda v: v > 0),
    "must be > 0 (1 is linear, 3 is Zhu & Gupta's; 0 would never leave "
    'initial_sparsity and a negative exponent diverges)',
  ),
  'threshold_decay': (is_fraction, FRACTION_RULE),
  'initial_sparsity': (is_fraction, FRACTION_RULE),
  'target_sparsity': (is_fraction, FRACTION_RULE),
  'nbins': (
    (lambda v: 2 <= v <= MAX_NBINS),
    'must be in [2, 2**24] (bin indices stay exact in float32)',
  ),
  'pruning_frequency': ((lambda v: v >= 1), 'must be >= 1'),
  'block_height': ((lambda v: v >= 1 or v == -1), 'must be >= 1 or -1 (whole dim)'),
  'block_width': ((lambda v: v >= 1 or v == -1), 'must be >= 1 or -1 (whole dim)'),
  'block_pooling_function': ((lambda v: v.upper() in POOLING), f'must be one of {POOLING}'),
  'threshold_method': ((lambda v: v in THRESHOLD_METHODS), f'must be one of {THRESHOLD_METHODS}'),
  'mask_source': (
    (lambda v: v in MASK_SOURCES),
    f"must be one of {MASK_SOURCES}: 'updated' thresholds params + updates (TF's "
    "rule), 'params' the params the step starts from (no cost on other steps)",
  ),
  'mask_search': (
    (lambda v: v in MASK_SEARCHES),
    f'must be one of {MASK_SEARCHES}: how thresholds are searched, with the same '
    "result: 'fixed' in a few passes with no per-leaf control flow (GPUs, "
    "TPUs), 'adaptive' with few candidates per pass (CPUs), 'auto' by "
    'jax.default_backend()',
  ),
}


def check_window(h: Fields) -> None:
  """The rules between fields: the pruning window and the schedule's steps."""
  check_rule(
    h.end_pruning_step == -1 or h.end_pruning_step > h.begin_pruning_step,
    'end_pruning_step',
    h.end_pruning_step,
    f'must be -1 (never stop) or > begin_pruning_step ({h.begin_pruning_step})',
  )
  check_rule(
    h.sparsity_function_end_step > h.sparsity_function_begin_step,
    'sparsity_function_end_step',
    h.sparsity_function_end_step,
    f'must be > sparsity_function_begin_step ({h.sparsity_function_begin_step})',
  )
  first_update = schedule.first_update_step(h)
  check_rule(
    h.end_pruning_step == -1 or h.end_pruning_step >= first_update,
    'end_pruning_step',
    h.end_pruning_step,
    f'comes before the first mask update, at step max(begin_pruning_step, '
    f'pruning_frequency) = {first_update}, so masks would never change; raise '
    'end_pruning_step or lower pruning_frequency',
  )
