"""Pruning hyperparameters: TF `model_pruning` names and defaults, parsing, validation.

The fields and defaults are those of TensorFlow's graph-style `model_pruning`
(Zhu & Gupta 2017, "To prune, or not to prune", arXiv:1710.01878), plus the
jaxprune additions; `Fields` (`jaxprune._config.fields`) is the one list of them.

Users edit a `ml_collections.ConfigDict` (`get_pruning_hparams`,
`parse_hparams`); the engine works from `HParams`, the frozen result of
`freeze`, which checks every field (type, range, maps), parses the maps and
warns about settings that cannot do what they seem to ask, once per config.

What the user set is recorded, never inferred from a value equal to its default
(`HParams.given`): a keyword, a name in TF's text, a field assigned in a config
of `get_pruning_hparams` / `parse_hparams` (`PruningConfig` records assignments),
and every field present in a dict or in another ConfigDict, which cannot tell
which of its fields were assigned.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import weakref
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from jaxprune._config import advice
from jaxprune._config import maps as maps
from jaxprune._config.fields import FIELD_DOCS, Fields
from jaxprune._config.maps import block_dims_map, layer_axes_map, nm_map, sparsity_map
from jaxprune._config.pruning_config import ALIASES, RENAMED, PruningConfig
from jaxprune._config.rules import RULES, check_rule, check_window, typed_value
from jaxprune._numerics import SMALLEST_NORMAL


@dataclasses.dataclass(frozen=True)
class HParams(Fields):
  """Validated hyperparameters: every field, its type and default, checked and parsed.

  `get_pruning_hparams()` is a ConfigDict of these fields (map fields as lists
  there); `pruning`, `pruned` and `jaxprune.MaskRule` implementations get them
  frozen as an `HParams`. Making one checks every field: a bad value is a
  ValueError naming the field, the value and the rule
  (docs/explanation/semantics.md#hyperparameters).

  Attributes:
  """

  # Parsed from the fields above.
  sparsity_entries: tuple[tuple[str, float], ...] = dataclasses.field(init=False, repr=False)
  block_entries: tuple[tuple[str, tuple[int, int]], ...] = dataclasses.field(init=False, repr=False)
  nm_entries: tuple[tuple[str, tuple[int, int]], ...] = dataclasses.field(init=False, repr=False)
  layer_entries: tuple[tuple[str, int | tuple[int, ...]], ...] = dataclasses.field(
    init=False, repr=False
  )
  nm: tuple[int, int] | None = dataclasses.field(init=False, repr=False)
  # The fields the user set, whatever their values; not part of the settings' equality.
  given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False, repr=False)

  def __post_init__(self) -> None:
    for field in _DEFAULTS:
      object.__setattr__(self, field, check_value(field, getattr(self, field)))
    unknown = sorted(set(self.given) - set(_DEFAULTS))
    if unknown:
      raise _unknown(unknown[0])
    object.__setattr__(self, 'given', frozenset(self.given))
    check_window(self)
    parsed = {
      'sparsity_entries': tuple(sparsity_map(self)),
      'block_entries': tuple(block_dims_map(self)),
      'nm_entries': tuple(nm_map(self)),
      'layer_entries': tuple(layer_axes_map(self)),
      'nm': _parse_global_nm(self.nm_sparsity),
    }
    for field, value in parsed.items():
      object.__setattr__(self, field, value)
    _check_nm_alone(self)
    if self.global_pruning and self.sparsity_entries:
      raise ValueError(
        f'weight_sparsity_map={list(self.weight_sparsity_map)!r}: per-variable '
        'targets cannot be combined with global_pruning=True; drop one of them.'
      )
    advice.warn_about(self, [s for _, s in self.sparsity_entries])

  @property
  def block_dims(self) -> tuple[int, int]:
    return self.block_height, self.block_width


def _check_nm_alone(h: HParams) -> None:
  """nm_sparsity gives every pruned leaf its pattern: a target beside it would be dropped
  (as `sparse.ste` refuses a sparsity and an N:M pattern together). A target the user
  gave is refused whatever its value, the default's 0.5 included (`HParams.given`)."""
  if h.nm is None:
    return
  n, m = h.nm
  dropped = [f'target_sparsity={h.target_sparsity}'] if 'target_sparsity' in h.given else []
  if h.sparsity_entries:
    dropped.append(f'weight_sparsity_map={list(h.weight_sparsity_map)!r}')
  if dropped:
    raise ValueError(
      f'nm_sparsity={h.nm_sparsity!r} keeps {n} of every {m} weights of each pruned leaf '
      f'({1 - n / m:.0%} sparse), so {" and ".join(dropped)} would be dropped: give a '
      f'target or nm_sparsity, not both (nm_sparsity_map=[regex:{n}:{m}] puts N:M on some '
      'leaves and leaves the target to the others).'
    )


def _record_keywords(init: Any) -> Any:
  """`HParams(**fields)` records the fields it is given, unless `given=` names them."""

  @functools.wraps(init)
  def __init__(self: HParams, **fields: Any) -> None:
    fields.setdefault('given', frozenset(fields))
    init(self, **fields)

  return __init__


HParams.__init__ = _record_keywords(HParams.__init__)

# The ConfigDict's fields and defaults, in HParams' order.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(HParams) if f.init and f.name != 'given'}
_PARSED_DOCS = {
  'sparsity_entries': '((regex, sparsity), ...) from weight_sparsity_map',
  'block_entries': '((regex, (height, width)), ...) from block_dims_map',
  'nm_entries': '((regex, (n, m)), ...) from nm_sparsity_map',
  'layer_entries': '((regex, leading layer axes K or (axis indices)), ...) from layer_axes_map',
  'nm': 'nm_sparsity as (n, m), or None',
  'block_dims': '(block_height, block_width)',
}
HParams.__doc__ += ''.join(
  [f'    {name}: {FIELD_DOCS[name]} (default {value!r}).\n' for name, value in _DEFAULTS.items()]
  + [f'    {name}: parsed, {text}.\n' for name, text in _PARSED_DOCS.items()]
  + [
    '    given: the fields the user set, whatever their values (by keyword, in the text, '
    'assigned in a config, or present in a dict).\n'
  ]
)


def given_fields(hparams: Any) -> frozenset[str]:
  """The fields `hparams` sets, whatever their values.

  Args:
    hparams: a `PruningConfig` (the fields assigned to it), an `HParams` (its
      `given`), a string in TF's syntax (the names in it), or a dict or other
      ConfigDict (every field it holds: it cannot tell which were assigned).

  Returns:
    The names of the fields.
  """
  if isinstance(hparams, HParams):
    return hparams.given
  if isinstance(hparams, PruningConfig):
    return hparams.assigned()
  if isinstance(hparams, str):
    return frozenset(item.split('=', 1)[0].strip() for item in maps.split_top_level(hparams))
  return frozenset(hparams.keys())


def get_pruning_hparams() -> ml_collections.ConfigDict:
  """The default pruning hyperparameters, as a ConfigDict to change and pass on.

  Each field, its default and its meaning are in the Semantics page's table of
  hyperparameters (in TF's names: `target_sparsity`, `pruning_frequency`, ...).

  Returns:
    A locked ConfigDict (a `PruningConfig`, which records the fields assigned
    to it as given, whatever their values): field types are fixed by their
    defaults (an int field rejects `2.5`), and a misspelled field
    (`hp.target_sparisty = 0.9`) is an error that suggests the right name
    instead of a silently ignored new field.

  Example:
    >>> import jaxprune
    >>> hp = jaxprune.get_pruning_hparams()
    >>> hp.target_sparsity, hp.pruning_frequency, hp.threshold_method
    (0.5, 10, 'histogram')
    >>> hp.target_sparisty = 0.9
    Traceback (most recent call last):
    ...
    AttributeError: ...
  """
  config = PruningConfig({k: list(v) if isinstance(v, tuple) else v for k, v in _DEFAULTS.items()})
  config.lock()
  return config


def _unknown(name: str) -> ValueError:
  if name in RENAMED:
    return ValueError(f'{name}: {RENAMED[name]}.')
  close = [ALIASES[name]] if name in ALIASES else difflib.get_close_matches(name, _DEFAULTS, n=1)
  hint = f'did you mean {close[0]!r}? ' if close else ''
  return ValueError(f'unknown hyperparameter {name!r}: {hint}known names: {sorted(_DEFAULTS)}.')


def parse_hparams(
  text: str = '', base: ml_collections.ConfigDict | None = None, **fields: Any
) -> ml_collections.ConfigDict:
  """Parses TF HParams syntax, and fields by keyword, on top of `base` (the defaults when None).

  Example: 'target_sparsity=0.9,weight_sparsity_map=[conv1:0.8,dense/kernel:0.95]',
  or `parse_hparams(target_sparsity=0.9, weight_sparsity_map=['conv1:0.8'])`.
  List values go in brackets and their entries are separated by commas. As in
  TF's parser, a name given twice (in the text, or in the text and by keyword) is
  an error.

  Args:
    text: comma-separated `name=value` pairs.
    base: the hyperparameters to override; not modified.
    fields: hparams fields by keyword, as typed values.

  Returns:
    A new, validated, locked `PruningConfig` whose given fields are those of
    `base` (see `given_fields`), the text's and the keywords'. It is frozen here,
    so `pruning(...)` of it, unchanged, neither checks it again nor repeats a warning.

  Example:
    >>> import jaxprune
    >>> hp = jaxprune.parse_hparams('target_sparsity=0.9,weight_sparsity_map=[conv1:0.8]')
    >>> hp.target_sparsity, list(hp.weight_sparsity_map)
    (0.9, ['conv1:0.8'])
  """
  if not isinstance(text, str):
    raise TypeError(
      f'parse_hparams: text={text!r} must be a string such as '
      "'target_sparsity=0.8,nbins=512'; give fields by keyword as "
      'parse_hparams(target_sparsity=0.8), and a config to build on as base=.'
    )
  hparams = get_pruning_hparams()
  if base is not None:
    _check_keys(base)
    hparams.update(base.to_dict() if isinstance(base, ml_collections.ConfigDict) else base)
    hparams.reset_assigned(given_fields(base))
  assigned: dict[str, str] = {}
  for item in maps.split_top_level(text):
    if '=' not in item:
      raise ValueError(f'parse_hparams: {item!r} is not of the form name=value.')
    name, raw = (s.strip() for s in item.split('=', 1))
    if name not in hparams:
      raise ValueError(f'parse_hparams: {_unknown(name)}')
    if name in assigned:
      raise ValueError(
        f'parse_hparams: {name} is assigned twice ({name}={assigned[name]} and '
        f'{name}={raw}); give it once.'
      )
    assigned[name] = raw
    hparams[name] = maps.convert(name, raw, hparams[name])
  for name, value in fields.items():
    if name not in hparams:
      raise ValueError(f'parse_hparams: {_unknown(name)}')
    if name in assigned:
      raise ValueError(
        f'parse_hparams: {name} is given twice ({name}={assigned[name]} in the text and '
        f'{name}={value!r} by keyword); give it once.'
      )
    value = check_value(name, value, where='parse_hparams')
    hparams[name] = list(value) if isinstance(value, tuple) else value
  freeze(hparams)
  return hparams


def _check_keys(hparams: Any) -> None:
  for key in hparams.keys():
    if key not in _DEFAULTS:
      raise _unknown(key)


def check_value(field: str, value: Any, where: str = '') -> Any:
  """Checks one field's type and range; returns the value as the field's type.

  The one definition of each field's rule, for `HParams` and for functions
  that take the same values as arguments (`masks.update_mask`).

  Args:
    field: an `HParams` field, e.g. 'nbins'.
    value: its value.
    where: prefix of the error message, e.g. 'update_mask'.

  Raises:
    ValueError: '<where>: <field>=<value>: <rule>.', naming the fix.
  """
  try:
    value = typed_value(field, value, _DEFAULTS[field])
    if field in RULES:
      check, rule = RULES[field]
      check_rule(check(value), field, value, rule)
    if field == 'sparsity_function_exponent':
      # The schedule runs in float32, where XLA flushes subnormals to zero: then
      # (1 - p) ** 0 == 1 and the sparsity never leaves initial_sparsity.
      check_rule(
        value >= SMALLEST_NORMAL,
        field,
        value,
        f'must be >= {np.float32(SMALLEST_NORMAL)} (the smallest normal float32): the '
        'schedule computes in float32, where a smaller exponent is 0 and nothing is ever '
        'pruned; for a jump to target_sparsity at sparsity_function_end_step, 1e-3 does',
      )
    if field == 'weight_name_regex':
      maps.check_regex(field, value)
  except ValueError as err:
    if where:
      raise ValueError(f'{where}: {err}') from None
    raise
  return value


def _parse_global_nm(text: str) -> tuple[int, int] | None:
  try:
    return maps.parse_nm(text)
  except ValueError as err:
    raise ValueError(f'nm_sparsity={text!r}: {err}') from None


def with_fields(hparams: Any, fields: Mapping[str, Any]) -> Any:
  """`hparams` (None: the defaults) with `fields` set by name, for `pruning(target_sparsity=...)`.

  Without fields, `hparams` is returned as it is (frozen later, once); with
  them, the `HParams` of both, whose given fields are `hparams`' and the keywords'
  (an unknown name is an error that suggests the right one). A keyword may set what
  `hparams` does not; a field that both set to different values is an error naming both.
  """
  if not fields:
    return get_pruning_hparams() if hparams is None else hparams
  frozen = HParams() if hparams is None else freeze(hparams)
  for name in fields:
    if name not in _DEFAULTS:
      raise _unknown(name)
  for name, value in fields.items():
    if name in frozen.given and not _same(getattr(frozen, name), value):
      raise ValueError(
        f'{name} is given twice, {name}={getattr(frozen, name)!r} in hparams and '
        f'{name}={value!r} by keyword; give it once (a keyword sets only what hparams '
        'does not set).'
      )
  values = {f: getattr(frozen, f) for f in _DEFAULTS}
  return HParams(**{**values, **fields}, given=frozen.given | set(fields))


def _same(a: Any, b: Any) -> bool:
  """Equal values, a list equal to a tuple of the same entries."""
  listed = (list, tuple)
  return list(a) == list(b) if isinstance(a, listed) and isinstance(b, listed) else a == b


# Configs already frozen, by identity: (a weak reference, their values and given fields,
# the result).
_FROZEN: dict[int, tuple[weakref.ref, tuple[dict[str, Any], frozenset[str]], HParams]] = {}


def _snapshot(hparams: Any) -> dict[str, Any]:
  """The config's values, with lists copied (a list edited in place is a change)."""
  _check_keys(hparams)
  return {
    field: tuple(value) if isinstance(value, list) else value
    for field, value in ((f, maps.field(hparams, f)) for f in _DEFAULTS if f in hparams)
  }


def freeze(hparams: str | ml_collections.ConfigDict | Mapping[str, Any] | HParams) -> HParams:
  """Validates `hparams` and returns the frozen, parsed `HParams`.

  A config is checked, and warned about, once: freezing the same ConfigDict
  again while its values are unchanged returns the first result (so
  `pruning(parse_hparams(...))` prints each warning once).

  Args:
    hparams: a ConfigDict (missing fields take their defaults), a mapping, a
      string in TF's syntax (see `parse_hparams`), or an `HParams` (returned as is).

  Returns:
    The `HParams`.

  Raises:
    ValueError: naming the field, the value and the rule when anything is wrong.
  """
  if isinstance(hparams, HParams):
    return hparams
  if isinstance(hparams, str):
    hparams = parse_hparams(hparams)
  if not isinstance(hparams, (Mapping, ml_collections.ConfigDict)):
    raise TypeError(
      f'hparams={hparams!r}: expected jaxprune.get_pruning_hparams() or '
      "jaxprune.parse_hparams('target_sparsity=0.9,...') (a ConfigDict), a dict "
      f'of fields, a string in that syntax, or an HParams; got {type(hparams)}.'
    )
  values = (_snapshot(hparams), given_fields(hparams))
  known = _FROZEN.get(id(hparams))
  if known is not None and known[0]() is hparams and known[1] == values:
    return known[2]
  frozen = HParams(**values[0], given=values[1])
  key = id(hparams)
  try:
    _FROZEN[key] = (weakref.ref(hparams, lambda _: _FROZEN.pop(key, None)), values, frozen)
  except TypeError:  # a plain dict cannot be referred to weakly: it is checked each time
    pass
  return frozen
