"""Pruning hyperparameters: TF `model_pruning` names and defaults, parsing, validation.

The fields and defaults are those of TensorFlow's graph-style `model_pruning`
(Zhu & Gupta 2017, "To prune, or not to prune", arXiv:1710.01878), plus the
jaxprune additions listed at the end of `get_pruning_hparams`.

Users edit a `ml_collections.ConfigDict`; the engine works from `HParams`, the
frozen result of `freeze`, which checks every field once (type, range, maps)
and parses the maps once.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from typing import Any

import ml_collections
import numpy as np

from jaxprune import maps, nm
from jaxprune.maps import block_dims_map, layer_axes_map, nm_map, sparsity_map

POOLING = ('AVG', 'MAX')
THRESHOLD_METHODS = ('histogram', 'exact')
MASK_SOURCES = ('updated', 'params')
# Which leaves are pruned by default: Dense/Conv kernels and embeddings (SPEC section 6).
DEFAULT_WEIGHT_NAME_REGEX = '(kernel|embedding)$'
# Steps and sizes live in int32 arrays inside jit.
INT32_MAX = maps.INT32_MAX
# Bin indices, counts and k / nbins stay exact in float32 up to 2**24.
MAX_NBINS = 2 ** 24


def get_pruning_hparams() -> ml_collections.ConfigDict:
  """Returns the default hyperparameters (SPEC section 1).

  Returns:
    A locked ConfigDict: field types are fixed by their defaults (an int field
    rejects `2.5`), and a misspelled field (`hp.target_sparisty = 0.9`) is an
    error that suggests the right name instead of a silently ignored new field.
  """
  config = ml_collections.ConfigDict(_DEFAULTS)
  config.lock()
  return config


_DEFAULTS = {
    'name': 'model_pruning',
    'begin_pruning_step': 0,
    'end_pruning_step': -1,
    'weight_sparsity_map': [''],
    'block_dims_map': [''],
    'threshold_decay': 0.0,
    'pruning_frequency': 10,
    'nbins': 256,
    'block_height': 1,
    'block_width': 1,
    'block_pooling_function': 'AVG',
    'initial_sparsity': 0.0,
    'target_sparsity': 0.5,
    'sparsity_function_begin_step': 0,
    'sparsity_function_end_step': 100,
    'sparsity_function_exponent': 3.0,
    'use_tpu': False,
    # jaxprune additions.
    'threshold_method': 'histogram',
    'weight_name_regex': DEFAULT_WEIGHT_NAME_REGEX,
    'global_pruning': False,
    'nm_sparsity': '',
    'nm_sparsity_map': [''],
    'layer_axes_map': [''],
    'mask_source': 'updated',
}

# tfmot's `sparsity_m_by_n=(m, n)` zeroes m of every n; ours keeps N of every M.
_RENAMED = {
    'sparsity_m_by_n': (
        "sparsity_m_by_n is tfmot's name, where (m, n) means m ZEROS in every n weights; "
        "jaxprune's field is nm_sparsity='N:M', which KEEPS N of every M: tfmot's (m, n) is "
        "nm_sparsity='<n-m>:<n>' (2:4 for (2, 4), 3:4 for (1, 4))"),
}


@dataclasses.dataclass(frozen=True)
class HParams:
  """Validated hyperparameters, parsed once (see `freeze`).

  The scalar fields have the ConfigDict's names, so code that reads
  `hparams.target_sparsity` works with either. The maps are parsed:

  Attributes:
    sparsity_entries: ((regex, sparsity), ...) from `weight_sparsity_map`.
    block_entries: ((regex, (height, width)), ...) from `block_dims_map`.
    nm_entries: ((regex, (n, m)), ...) from `nm_sparsity_map`.
    layer_entries: ((regex, number of leading layer axes), ...) from `layer_axes_map`.
    block_dims: (block_height, block_width).
    nm: `nm_sparsity` as (n, m), or None.
  """
  name: str
  begin_pruning_step: int
  end_pruning_step: int
  threshold_decay: float
  pruning_frequency: int
  nbins: int
  block_height: int
  block_width: int
  block_pooling_function: str
  initial_sparsity: float
  target_sparsity: float
  sparsity_function_begin_step: int
  sparsity_function_end_step: int
  sparsity_function_exponent: float
  use_tpu: bool
  threshold_method: str
  mask_source: str
  weight_name_regex: str
  global_pruning: bool
  sparsity_entries: tuple[tuple[str, float], ...]
  block_entries: tuple[tuple[str, tuple[int, int]], ...]
  nm_entries: tuple[tuple[str, tuple[int, int]], ...]
  layer_entries: tuple[tuple[str, int], ...]
  nm: tuple[int, int] | None

  @property
  def block_dims(self) -> tuple[int, int]:
    return self.block_height, self.block_width


def _split_top_level(text: str) -> list[str]:
  """Splits 'a=1,b=[x,y],c=2' on the commas that are outside brackets."""
  parts, depth, current = [], 0, []
  for char in text:
    if char == '[':
      depth += 1
    elif char == ']':
      depth -= 1
      if depth < 0:
        raise ValueError(f'parse_hparams: unbalanced "]" in {text!r}.')
    if char == ',' and depth == 0:
      parts.append(''.join(current))
      current = []
    else:
      current.append(char)
  if depth != 0:
    raise ValueError(f'parse_hparams: unbalanced "[" in {text!r}.')
  parts.append(''.join(current))
  return [p.strip() for p in parts if p.strip()]


def _convert(name: str, raw: str, default: Any) -> Any:
  """Converts the text of one value to the type of the field's default."""
  if isinstance(default, (list, tuple)):
    if not (raw.startswith('[') and raw.endswith(']')):
      raise ValueError(
          f'parse_hparams: {name}={raw!r} must be a bracketed list, e.g. {name}=[regex:value].')
    return [item.strip() for item in raw[1:-1].split(',') if item.strip()] or ['']
  if isinstance(default, bool):
    lowered = raw.lower()
    if lowered not in ('true', 'false', '1', '0'):
      raise ValueError(f'parse_hparams: {name}={raw!r} must be true or false.')
    return lowered in ('true', '1')
  if isinstance(default, int):
    try:
      return int(raw)
    except ValueError:
      raise ValueError(f'parse_hparams: {name}={raw!r} must be an integer.') from None
  if isinstance(default, float):
    try:
      return float(raw)
    except ValueError:
      raise ValueError(f'parse_hparams: {name}={raw!r} must be a number.') from None
  return raw


def _unknown(name: str) -> ValueError:
  if name in _RENAMED:
    return ValueError(f'{name}: {_RENAMED[name]}.')
  close = difflib.get_close_matches(name, _DEFAULTS, n=1)
  hint = f'did you mean {close[0]!r}? ' if close else ''
  return ValueError(f'unknown hyperparameter {name!r}: {hint}known names: {sorted(_DEFAULTS)}.')


def parse_hparams(text: str, base: ml_collections.ConfigDict | None = None
                  ) -> ml_collections.ConfigDict:
  """Parses TF HParams syntax on top of `base` (the defaults when None).

  Example: 'target_sparsity=0.9,weight_sparsity_map=[conv1:0.8,dense/kernel:0.95]'.
  List values go in brackets and their entries are separated by commas. As in
  TF's parser, a name given twice is an error.

  Args:
    text: comma-separated `name=value` pairs.
    base: the hyperparameters to override; not modified.

  Returns:
    A new, validated, locked ConfigDict.
  """
  hparams = get_pruning_hparams()
  if base is not None:
    _check_keys(base)
    hparams.update(base.to_dict() if isinstance(base, ml_collections.ConfigDict) else base)
  assigned: dict[str, str] = {}
  for item in _split_top_level(text):
    if '=' not in item:
      raise ValueError(f'parse_hparams: {item!r} is not of the form name=value.')
    name, raw = (s.strip() for s in item.split('=', 1))
    if name not in hparams:
      raise ValueError(f'parse_hparams: {_unknown(name)}')
    if name in assigned:
      raise ValueError(f'parse_hparams: {name} is assigned twice ({name}={assigned[name]} and '
                       f'{name}={raw}); give it once.')
    assigned[name] = raw
    hparams[name] = _convert(name, raw, hparams[name])
  freeze(hparams)
  return hparams


def _check(condition: bool, field: str, value: Any, rule: str) -> None:
  if not condition:
    raise ValueError(f'{field}={value!r}: {rule}.')


def _check_keys(hparams: Any) -> None:
  for key in hparams.keys():
    if key not in _DEFAULTS:
      raise _unknown(key)


def _typed(field: str, value: Any) -> Any:
  """The value as the type of the field's default, or a ValueError naming both."""
  default = _DEFAULTS[field]
  if isinstance(default, bool):
    if isinstance(value, (bool, np.bool_)):
      return bool(value)
    raise ValueError(f'{field}={value!r}: must be True or False (default {default}).')
  if isinstance(default, int):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
      _check(-INT32_MAX - 1 <= value <= INT32_MAX, field, value,
             'must fit in int32 (steps and sizes are int32 arrays inside jit)')
      return int(value)
    raise ValueError(f'{field}={value!r}: must be an integer (default {default}).')
  if isinstance(default, float):
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)):
      _check(math.isfinite(value), field, value, 'must be a finite number')
      return float(value)
    raise ValueError(f'{field}={value!r}: must be a number (default {default}).')
  if isinstance(default, str):
    if isinstance(value, str):
      return value
    raise ValueError(f'{field}={value!r}: must be a string (default {default!r}).')
  if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
    return list(value)
  raise ValueError(f'{field}={value!r}: must be a list of "regex:value" strings '
                   f'(default {default!r}).')


def freeze(hparams: Any) -> HParams:
  """Validates `hparams` once and returns the frozen, parsed `HParams`.

  Accepts a ConfigDict (missing fields take their defaults), a mapping, or an
  `HParams` (returned as is). Raises ValueError naming the field, the value and
  the rule when anything is wrong; warns when `end_pruning_step` stops the
  mask updates before the schedule reaches its target.
  """
  if isinstance(hparams, HParams):
    return hparams
  _check_keys(hparams)
  h = {field: _typed(field, maps.field(hparams, field) if field in hparams else default)
       for field, default in _DEFAULTS.items()}
  _check_ranges(h)
  frozen = HParams(
      **{k: v for k, v in h.items() if not isinstance(v, list) and k != 'nm_sparsity'},
      sparsity_entries=tuple(sparsity_map(h)),
      block_entries=tuple(block_dims_map(h)),
      nm_entries=tuple(nm_map(h)),
      layer_entries=tuple(layer_axes_map(h)),
      nm=_parse_global_nm(h['nm_sparsity']))
  if frozen.global_pruning:
    _check(not frozen.sparsity_entries, 'weight_sparsity_map', h['weight_sparsity_map'],
           'per-variable targets cannot be combined with global_pruning=True; drop one of them')
  _warn_if_target_unreached(frozen)
  return frozen


def validate(hparams: Any) -> HParams:
  """Raises ValueError naming the field and the value when a rule is broken."""
  return freeze(hparams)


def _parse_global_nm(text: str) -> tuple[int, int] | None:
  try:
    return nm.parse_nm(text)
  except ValueError as err:
    raise ValueError(f'nm_sparsity={text!r}: {err}') from None


def _check_ranges(h: dict[str, Any]) -> None:
  """SPEC section 1's rules, and the limits of int32 / float32 arithmetic."""
  _check(h['begin_pruning_step'] >= 0, 'begin_pruning_step', h['begin_pruning_step'],
         'must be >= 0')
  _check(h['end_pruning_step'] == -1 or h['end_pruning_step'] > h['begin_pruning_step'],
         'end_pruning_step', h['end_pruning_step'],
         f'must be -1 (never stop) or > begin_pruning_step ({h["begin_pruning_step"]})')
  _check(h['sparsity_function_begin_step'] >= 0, 'sparsity_function_begin_step',
         h['sparsity_function_begin_step'], 'must be >= 0')
  _check(h['sparsity_function_end_step'] > h['sparsity_function_begin_step'],
         'sparsity_function_end_step', h['sparsity_function_end_step'],
         f'must be > sparsity_function_begin_step ({h["sparsity_function_begin_step"]})')
  _check(h['sparsity_function_exponent'] > 0, 'sparsity_function_exponent',
         h['sparsity_function_exponent'],
         'must be > 0 (1 is linear, 3 is Zhu & Gupta\'s; 0 would never leave '
         'initial_sparsity and a negative exponent diverges)')
  for field in ('threshold_decay', 'initial_sparsity', 'target_sparsity'):
    _check(0.0 <= h[field] < 1.0, field, h[field], 'must be in [0, 1)')
  _check(2 <= h['nbins'] <= MAX_NBINS, 'nbins', h['nbins'],
         'must be in [2, 2**24] (bin indices stay exact in float32)')
  _check(h['pruning_frequency'] >= 1, 'pruning_frequency', h['pruning_frequency'],
         'must be >= 1')
  first_update = max(h['begin_pruning_step'], h['pruning_frequency'])
  _check(h['end_pruning_step'] == -1 or h['end_pruning_step'] >= first_update,
         'end_pruning_step', h['end_pruning_step'],
         f'comes before the first mask update, at step max(begin_pruning_step, '
         f'pruning_frequency) = {first_update}, so masks would never change; raise '
         'end_pruning_step or lower pruning_frequency')
  for field in ('block_height', 'block_width'):
    _check(h[field] >= 1 or h[field] == -1, field, h[field], 'must be >= 1 or -1 (whole dim)')
  _check(h['block_pooling_function'].upper() in POOLING, 'block_pooling_function',
         h['block_pooling_function'], f'must be one of {POOLING}')
  _check(h['threshold_method'] in THRESHOLD_METHODS, 'threshold_method', h['threshold_method'],
         f'must be one of {THRESHOLD_METHODS}')
  _check(h['mask_source'] in MASK_SOURCES, 'mask_source', h['mask_source'],
         f"must be one of {MASK_SOURCES}: 'updated' thresholds params + updates (TF's "
         "rule), 'params' the params the step starts from (no cost on other steps)")
  maps.check_regex('weight_name_regex', h['weight_name_regex'])


def _warn_if_target_unreached(h: HParams) -> None:
  end = h.end_pruning_step
  if end == -1 or end >= h.sparsity_function_end_step:
    return
  warnings.warn(
      f'jaxprune: end_pruning_step={end} stops mask updates before '
      f'sparsity_function_end_step={h.sparsity_function_end_step}: the last update is at or '
      f'before step {end}, so the sparsity stays below target_sparsity={h.target_sparsity}. '
      'Set end_pruning_step >= sparsity_function_end_step (or -1) to reach the target.',
      stacklevel=3)
