"""Checks a training config before anything runs.

Every field is checked for its type and range (`check_config`), with a
one-line message naming the field, the value and the fix, and a run that
would stop before its pruning schedule reaches the target is found
beforehand (`schedule_shortfall`).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

import jaxprune
from jaxprune._config import hparams as hparams_lib
from jaxprune._config import schedule as schedule
from jaxprune_train import _defaults as defaults
from jaxprune_train._errors import ConfigError

# A config's sub-blocks (`data`, `model`, ...): ConfigDicts are not Mappings.
_BLOCKS = (Mapping, ml_collections.ConfigDict)
# Step counters (the train state's and the pruning state's) are int32.
MAX_STEPS = 2**31 - 1


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _int_in(low: int, high: int = MAX_STEPS) -> tuple[Callable[[Any], bool], str]:
  return (lambda v: _is_int(v) and low <= v <= high), f'must be an integer in [{low}, {high}]'


def _one_of(*options: str) -> tuple[Callable[[Any], bool], str]:
  return (lambda v: v in options), f'must be one of {options}'


_BOOL = (lambda v: isinstance(v, bool)), 'must be True or False'
_STRING = (lambda v: isinstance(v, str)), 'must be a string'
_EVERY = _int_in(1)

# field -> (check, rule); the message adds the default as the example of a good value.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
  'name': ((lambda v: isinstance(v, str) and v.strip() != ''), 'must be a non-empty string'),
  'seed': _int_in(0),
  'data.name': _one_of('digits', 'npz', 'text'),
  'data.path': _STRING,
  'data.test_fraction': ((lambda v: _is_number(v) and 0 < v < 1), 'must be a number in (0, 1)'),
  'data.seed': _int_in(0),
  'data.seq_len': _int_in(1, 2**20),
  'data.test_windows': _int_in(1, 2**24),
  'model.name': _one_of('mlp', 'cnn', 'lm'),
  'model.features': (
    (
      lambda v: (
        isinstance(v, (tuple, list))
        and len(v) > 0
        and all(_is_int(w) and 1 <= w <= MAX_STEPS for w in v)
      )
    ),
    'must be a non-empty tuple of positive integers',
  ),
  'model.dense': _int_in(1),
  'model.num_layers': _int_in(1, 4096),
  'model.d_model': _int_in(2, 2**20),
  'model.num_heads': _int_in(1, 4096),
  'model.num_kv_heads': _int_in(1, 4096),
  'model.mlp_dim': _int_in(1, 2**20),
  'model.compute_dtype': _one_of('bfloat16', 'float32'),
  'optimizer.name': _one_of('adam', 'adamw', 'sgd'),
  'optimizer.learning_rate': ((lambda v: _is_number(v) and v > 0), 'must be a finite number > 0'),
  'optimizer.momentum': (
    (lambda v: _is_number(v) and 0 <= v < 1),
    'must be a finite number in [0, 1)',
  ),
  'optimizer.weight_decay': ((lambda v: _is_number(v) and v >= 0), 'must be a finite number >= 0'),
  'batch_size': _int_in(1),
  'mesh_shape': (
    (
      lambda v: (
        isinstance(v, (tuple, list))
        and (len(v) == 0 or (len(v) == 2 and all(_is_int(n) and n >= 1 for n in v)))
      )
    ),
    'must be () for one device or (data, model) device counts such as (2, 4)',
  ),
  'num_steps': _int_in(1),
  'prune': _BOOL,
  'log_every': _EVERY,
  'eval_every': _EVERY,
  'checkpoint_every': _EVERY,
  'max_checkpoints_to_keep': (
    (lambda v: _is_int(v) and 1 <= v <= 10**6),
    'must be an integer >= 1, or no checkpoint is kept to resume from',
  ),
  'progress_bar': _BOOL,
  'tensorboard': _BOOL,
  'plots': _BOOL,
  'channels.enabled': _BOOL,
  'channels.round_to': _int_in(1),
  'channels.min_channels': _int_in(1),
}


def _flatten(config: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  flat = {}
  for key, value in config.items():
    if isinstance(value, _BLOCKS) and f'{prefix}{key}' != 'pruning':
      flat.update(_flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def _unknown(name: str, known: list[str]) -> ConfigError:
  close = difflib.get_close_matches(name, known, n=1)
  hint = f"did you mean '{close[0]}'?" if close else f'known fields: {", ".join(sorted(known))}.'
  return ConfigError(f'config.{name}: the config has no such field; {hint}')


def check_config(config: ml_collections.ConfigDict) -> None:
  """Checks every field of a training config.

  Args:
    config: a training config (see `jaxprune_train/_defaults.py`).

  Raises:
    ConfigError: a ValueError naming the first bad field, its value and the
      fix; for the `pruning` block (unknown fields included), jaxprune's own
      hparams message.
  """
  default = defaults.get_config()
  fields, expected = _flatten(config), _flatten(default)
  for name in fields:
    if name not in expected:
      raise _unknown(name, list(expected))
  for name, (check, rule) in RULES.items():
    if name not in fields:
      raise ConfigError(
        f'config.{name} is missing; start the config from '
        'jaxprune_train.get_config(), whose value is '
        f'{expected[name]!r}.'
      )
    if not check(fields[name]):
      raise ConfigError(
        f'config.{name}={fields[name]!r}: {rule} (the default is {expected[name]!r}).'
      )
  if fields['channels.enabled'] and not fields['prune']:
    raise ConfigError(
      'config.channels.enabled=True prunes whole channels, but config.prune='
      'False trains the dense model only; set one of them the other way.'
    )
  _check_model_data(fields)
  if 'pruning' not in config:
    raise ConfigError(
      'config.pruning is missing; start the config from '
      'jaxprune_train.get_config(), or set it to '
      'jaxprune_train.pruning_config().'
    )
  pruning = config.pruning
  if not isinstance(pruning, _BLOCKS):
    raise ConfigError(
      f'config.pruning={pruning!r}: must be a ConfigDict of pruning hparams, '
      'e.g. jaxprune_train.pruning_config().'
    )
  try:
    hparams_lib.freeze(pruning)
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err)) from err


def schedule_shortfall(config: ml_collections.ConfigDict) -> str | None:
  """Says why a pruning run ends short of its target sparsity, or None if it does not.

  Args:
    config: a checked training config.

  Returns:
    A one-line warning naming the fields involved and the value that fixes
    it, or None (also when the run does not prune).
  """
  if not config.prune:
    return None
  hparams, num_steps = config.pruning, config.num_steps
  first = schedule.first_update_step(hparams)
  last = schedule.final_update_step(hparams, num_steps)
  if last is None:
    return (
      f'config.num_steps={num_steps}: the run ends before its first mask update (at '
      f'step max(begin_pruning_step, pruning_frequency) = {first}), so nothing is '
      'pruned; raise num_steps or start pruning earlier.'
    )
  reached = float(jaxprune.sparsity_at(hparams, last))
  if reached >= hparams.target_sparsity - 1e-6:
    return None
  end = hparams.sparsity_function_end_step
  by_window = 0 <= hparams.end_pruning_step < num_steps - 1
  if by_window and hparams.end_pruning_step < end:
    return None  # jaxprune's hparams check has warned about this window already
  frequency = hparams.pruning_frequency
  # The first update at or after the schedule's end: the one that reaches the target.
  needed = first + max(-(-(end - first) // frequency), 0) * frequency
  cause = (
    f'config.pruning.end_pruning_step={hparams.end_pruning_step}'
    if by_window
    else f'config.num_steps={num_steps}'
  )
  fix = f'end_pruning_step={needed} or later' if by_window else f'num_steps above {needed}'
  return (
    f'{cause} stops the mask updates at step {last}, where the schedule is at '
    f'{reached:.1%} sparsity, short of target_sparsity={hparams.target_sparsity} '
    f'(reached at sparsity_function_end_step={end}, by the update at step {needed}); '
    f'set {fix}, or end the schedule earlier.'
  )


def _check_model_data(fields: Mapping[str, Any]) -> None:
  """The language model reads text and only text; channel pruning is for the MLP and CNN."""
  lm, text = fields['model.name'] == 'lm', fields['data.name'] == 'text'
  if lm != text:
    given = 'model.name' if lm else 'data.name'
    raise ConfigError(
      f'config.{given}={fields[given]!r} needs config.{"data.name" if lm else "model.name"}='
      f'{"text" if lm else "lm"!r}: the language model reads text (bytes) and only it '
      'reads text; start from configs/lm.py, or set both.'
    )
  if lm and fields['channels.enabled']:
    raise ConfigError(
      "config.channels.enabled=True prunes channels of the MLP and CNN, not model.name='lm'; "
      'set it to False (the language model is pruned weight by weight, layer by layer).'
    )
