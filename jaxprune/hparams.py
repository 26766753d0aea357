"""Pruning hyperparameters: TF `model_pruning` names and defaults, parsing, validation.

The fields and defaults are those of TensorFlow's graph-style `model_pruning`
(Zhu & Gupta 2017, "To prune, or not to prune", arXiv:1710.01878), plus the
jaxprune additions listed at the end of `get_pruning_hparams`.
"""

from __future__ import annotations

import re
from typing import Any

import ml_collections

from jaxprune import nm

_POOLING = ('AVG', 'MAX')
THRESHOLD_METHODS = ('histogram', 'exact')
# Which leaves are pruned by default: Dense/Conv kernels and embeddings (SPEC section 6).
DEFAULT_WEIGHT_NAME_REGEX = '(kernel|embedding)$'


def get_pruning_hparams() -> ml_collections.ConfigDict:
  """Returns the default hyperparameters (SPEC section 1).

  Returns:
    A ConfigDict whose field types are fixed by their defaults, so an int field
    rejects `2.5` and a list field rejects a string.
  """
  return ml_collections.ConfigDict({
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
      'sparsity_m_by_n': '',
      'nm_sparsity_map': [''],
  })


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


def parse_hparams(text: str, base: ml_collections.ConfigDict | None = None
                  ) -> ml_collections.ConfigDict:
  """Parses TF HParams syntax on top of `base` (the defaults when None).

  Example: 'target_sparsity=0.9,weight_sparsity_map=[conv1:0.8,dense/kernel:0.95]'.
  List values go in brackets and their entries are separated by commas.

  Args:
    text: comma-separated `name=value` pairs.
    base: the hyperparameters to override; not modified.

  Returns:
    A new, validated ConfigDict.
  """
  hparams = get_pruning_hparams() if base is None else ml_collections.ConfigDict(base.to_dict())
  known = sorted(hparams.keys())
  for item in _split_top_level(text):
    if '=' not in item:
      raise ValueError(f'parse_hparams: {item!r} is not of the form name=value.')
    name, raw = (s.strip() for s in item.split('=', 1))
    if name not in hparams:
      raise ValueError(f'parse_hparams: unknown hyperparameter {name!r}; known names: {known}.')
    hparams[name] = _convert(name, raw, hparams[name])
  validate(hparams)
  return hparams


def _entries(hparams: ml_collections.ConfigDict, field: str) -> list[tuple[str, str]]:
  """Splits the non-empty entries of a map at their LAST ':' into (regex, value)."""
  entries = []
  for entry in hparams[field]:
    if not entry:
      continue
    if ':' not in entry:
      raise ValueError(f'{field} entry {entry!r}: expected "regex:value".')
    regex, value = entry.rsplit(':', 1)
    try:
      re.compile(regex)
    except re.error as err:
      raise ValueError(f'{field} entry {entry!r}: invalid regex {regex!r} ({err}).') from None
    entries.append((regex, value.strip()))
  return entries


def sparsity_map(hparams: ml_collections.ConfigDict) -> list[tuple[str, float]]:
  """Returns `weight_sparsity_map` as [(regex, sparsity)], validated."""
  parsed = []
  for regex, value in _entries(hparams, 'weight_sparsity_map'):
    try:
      sparsity = float(value)
    except ValueError:
      raise ValueError(f'weight_sparsity_map entry {regex}:{value}: '
                       f'sparsity {value!r} is not a number.') from None
    if not 0.0 <= sparsity < 1.0:
      raise ValueError(f'weight_sparsity_map entry {regex}:{value}: '
                       'sparsity must be in [0, 1).')
    parsed.append((regex, sparsity))
  return parsed


def _block_dim(field: str, entry: str, text: str) -> int:
  try:
    dim = int(text)
  except ValueError:
    raise ValueError(f'{field} entry {entry!r}: block dim {text!r} is not an integer.') from None
  if dim < 1 and dim != -1:
    raise ValueError(f'{field} entry {entry!r}: block dims must be >= 1 or -1, got {dim}.')
  return dim


def block_dims_map(hparams: ml_collections.ConfigDict) -> list[tuple[str, tuple[int, int]]]:
  """Returns `block_dims_map` as [(regex, (height, width))], validated."""
  parsed = []
  for regex, value in _entries(hparams, 'block_dims_map'):
    entry = f'{regex}:{value}'
    dims = value.lower().split('x')
    if len(dims) != 2:
      raise ValueError(f'block_dims_map entry {entry!r}: block dims must be HxW, e.g. 4x4.')
    parsed.append((regex, tuple(_block_dim('block_dims_map', entry, d) for d in dims)))
  return parsed


def nm_map(hparams: ml_collections.ConfigDict) -> list[tuple[str, tuple[int, int]]]:
  """Returns `nm_sparsity_map` as [(regex, (n, m))]; entries read 'regex:N:M'."""
  parsed = []
  for entry in hparams.nm_sparsity_map:
    if not entry:
      continue
    pieces = entry.rsplit(':', 2)
    if len(pieces) != 3:
      raise ValueError(
          f'nm_sparsity_map entry {entry!r}: expected "regex:N:M", e.g. "Dense_0:2:4".')
    regex = pieces[0]
    try:
      re.compile(regex)
    except re.error as err:
      raise ValueError(
          f'nm_sparsity_map entry {entry!r}: invalid regex {regex!r} ({err}).') from None
    try:
      parsed.append((regex, nm.parse_nm(f'{pieces[1]}:{pieces[2]}')))
    except ValueError as err:
      raise ValueError(f'nm_sparsity_map entry {entry!r}: {err}') from None
  return parsed


def _check(condition: bool, field: str, value: Any, rule: str) -> None:
  if not condition:
    raise ValueError(f'{field}={value!r}: {rule}.')


def validate(hparams: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field and the value when a rule is broken."""
  h = hparams
  _check(h.begin_pruning_step >= 0, 'begin_pruning_step', h.begin_pruning_step, 'must be >= 0')
  _check(h.end_pruning_step == -1 or h.end_pruning_step > h.begin_pruning_step,
         'end_pruning_step', h.end_pruning_step,
         f'must be -1 (never stop) or > begin_pruning_step ({h.begin_pruning_step})')
  _check(h.sparsity_function_begin_step >= 0, 'sparsity_function_begin_step',
         h.sparsity_function_begin_step, 'must be >= 0')
  _check(h.sparsity_function_end_step > h.sparsity_function_begin_step,
         'sparsity_function_end_step', h.sparsity_function_end_step,
         f'must be > sparsity_function_begin_step ({h.sparsity_function_begin_step})')
  for field in ('threshold_decay', 'initial_sparsity', 'target_sparsity'):
    _check(0.0 <= h[field] < 1.0, field, h[field], 'must be in [0, 1)')
  _check(h.nbins >= 2, 'nbins', h.nbins, 'must be >= 2')
  _check(h.pruning_frequency >= 1, 'pruning_frequency', h.pruning_frequency, 'must be >= 1')
  for field in ('block_height', 'block_width'):
    _check(h[field] >= 1 or h[field] == -1, field, h[field], 'must be >= 1 or -1 (whole dim)')
  _check(h.block_pooling_function.upper() in _POOLING, 'block_pooling_function',
         h.block_pooling_function, f'must be one of {_POOLING}')
  _check(h.threshold_method in THRESHOLD_METHODS, 'threshold_method', h.threshold_method,
         f'must be one of {THRESHOLD_METHODS}')
  try:
    re.compile(h.weight_name_regex)
  except re.error as err:
    raise ValueError(f'weight_name_regex={h.weight_name_regex!r}: invalid regex ({err}).') from None
  sparsity_map(h)
  block_dims_map(h)
  nm_map(h)
  try:
    nm.parse_nm(h.sparsity_m_by_n)
  except ValueError as err:
    raise ValueError(f'sparsity_m_by_n={h.sparsity_m_by_n!r}: {err}') from None
  if h.global_pruning:
    _check(not sparsity_map(h), 'weight_sparsity_map', list(h.weight_sparsity_map),
           'per-variable targets cannot be combined with global_pruning=True; drop one of them')
