"""Tests for jaxprune_train._validate: every field of the job's config, and the schedule check."""

import pytest

import jaxprune
from jaxprune._config.fields import FIELD_DOCS
from jaxprune_train import ConfigError
from jaxprune_train import _defaults as defaults
from jaxprune_train import _validate as validate


def _set(config, dotted, value):
  node = config
  *parents, leaf = dotted.split('.')
  for parent in parents:
    node = node[parent]
  # Deleted first: ConfigDict keeps a field's type, a config file's own dict need not.
  del node[leaf]
  node[leaf] = value


@pytest.mark.parametrize(
  'field, value, rule, default',
  [
    ('name', '', 'must be a non-empty string', 'digits_mlp'),
    ('seed', -1, 'must be an integer in [0, 2147483647]', 0),
    ('seed', 2**31, 'must be an integer in [0, 2147483647]', 0),
    ('data.name', 'mnist', "must be one of ('digits', 'npz', 'text')", 'digits'),
    ('data.path', None, 'must be a string', ''),
    ('data.test_fraction', 1.0, 'must be a number in (0, 1)', 0.25),
    ('data.test_fraction', float('nan'), 'must be a number in (0, 1)', 0.25),
    ('data.seed', 1.5, 'must be an integer in [0, 2147483647]', 0),
    ('model.name', 'resnet', "must be one of ('mlp', 'cnn', 'lm')", 'mlp'),
    ('model.features', (), 'must be a non-empty tuple of positive integers', (300, 100)),
    ('model.features', (300, 0), 'must be a non-empty tuple of positive integers', (300, 100)),
    ('model.features', '300', 'must be a non-empty tuple of positive integers', (300, 100)),
    ('model.dense', 0, 'must be an integer in [1, 2147483647]', 64),
    ('optimizer.name', 'lamb', "must be one of ('adam', 'adamw', 'sgd')", 'adam'),
    ('optimizer.learning_rate', float('nan'), 'must be a finite number > 0', 0.001),
    ('optimizer.learning_rate', float('inf'), 'must be a finite number > 0', 0.001),
    ('optimizer.learning_rate', 0.0, 'must be a finite number > 0', 0.001),
    ('optimizer.momentum', 1.0, 'must be a finite number in [0, 1)', 0.9),
    ('optimizer.weight_decay', -1e-4, 'must be a finite number >= 0', 0.0001),
    ('batch_size', 0, 'must be an integer in [1, 2147483647]', 64),
    (
      'mesh_shape',
      (8,),
      'must be () for one device or (data, model) device counts such as (2, 4)',
      (),
    ),
    (
      'mesh_shape',
      (2, 0),
      'must be () for one device or (data, model) device counts such as (2, 4)',
      (),
    ),
    ('num_steps', 0, 'must be an integer in [1, 2147483647]', 3000),
    ('num_steps', 3_000_000_000, 'must be an integer in [1, 2147483647]', 3000),
    ('prune', 1, 'must be True or False', True),
    ('log_every', 0, 'must be an integer in [1, 2147483647]', 20),
    ('eval_every', True, 'must be an integer in [1, 2147483647]', 250),
    ('checkpoint_every', -5, 'must be an integer in [1, 2147483647]', 500),
    (
      'max_checkpoints_to_keep',
      0,
      'must be an integer >= 1, or no checkpoint is kept to resume from',
      2,
    ),
    ('progress_bar', 'yes', 'must be True or False', True),
    ('tensorboard', None, 'must be True or False', True),
    ('plots', 0, 'must be True or False', True),
  ],
)
def test_each_field_is_checked_with_a_one_line_message(field, value, rule, default):
  config = defaults.get_config()
  _set(config, field, value)
  with pytest.raises(ConfigError) as err:
    validate.check_config(config)
  assert str(err.value) == f'config.{field}={value!r}: {rule} (the default is {default!r}).'


def test_every_field_of_the_defaults_has_a_rule_and_a_meaning():
  fields = set(validate._flatten(defaults.get_config()))
  assert fields == set(validate.RULES) | {'pruning'}
  assert fields == set(defaults.FIELD_HELP)
  assert set(FIELD_DOCS) == set(jaxprune.get_pruning_hparams())
  validate.check_config(defaults.get_config())


def test_unknown_and_missing_fields_are_named():
  config = defaults.get_config()
  config.num_step = 10
  with pytest.raises(
    ConfigError,
    match=r'^config.num_step: the config has no such field; did '
    r"you mean 'num_steps'\?$",
  ):
    validate.check_config(config)
  config = defaults.get_config()
  config.pruning.target_sparisty = 0.95  # jaxprune's own message
  with pytest.raises(
    ConfigError,
    match=r"^unknown hyperparameter 'target_sparisty': did you "
    r"mean 'target_sparsity'\? known names: \[",
  ):
    validate.check_config(config)
  config = defaults.get_config()
  del config['plots']
  with pytest.raises(
    ConfigError,
    match=r'^config.plots is missing; start the config from '
    r'jaxprune_train.get_config\(\), whose value '
    r'is True.$',
  ):
    validate.check_config(config)
  del config['pruning']
  config.plots = True
  with pytest.raises(ConfigError, match=r'^config.pruning is missing; start the config from '):
    validate.check_config(config)


def test_pruning_errors_are_the_core_message():
  config = defaults.get_config()
  config.pruning.target_sparsity = 1.5
  with pytest.raises(ConfigError, match=r'^target_sparsity=1.5: must be in \[0, 1\)'):
    validate.check_config(config)


def test_a_run_shorter_than_its_schedule_is_found():
  config = defaults.get_config()
  assert validate.schedule_shortfall(config) is None
  config.num_steps = 2001  # the last update is at step 2000, where the target is reached
  assert validate.schedule_shortfall(config) is None
  # Updates at 500, 550, ..., 950; s(950) = 0.9 * (1 - (1 - 450 / 1500) ** 3) = 0.5913.
  config.num_steps = 1000
  assert validate.schedule_shortfall(config) == (
    'config.num_steps=1000 stops the mask updates at step 950, where the schedule is at 59.1% '
    'sparsity, short of target_sparsity=0.9 (reached at sparsity_function_end_step=2000, by '
    'the update at step 2000); set num_steps above 2000, or end the schedule earlier.'
  )
  config.num_steps = 500  # steps 0 .. 499: the first update would be at 500
  assert validate.schedule_shortfall(config) == (
    'config.num_steps=500: the run ends before its first mask update (at step '
    'max(begin_pruning_step, pruning_frequency) = 500), so nothing is pruned; raise num_steps '
    'or start pruning earlier.'
  )
  config.prune = False
  assert validate.schedule_shortfall(config) is None


def test_a_window_closing_before_the_schedule_is_left_to_the_hparams_warning():
  config = defaults.get_config()
  config.pruning.end_pruning_step = 1500
  with pytest.warns(UserWarning, match='end_pruning_step=1500 stops mask updates before'):
    validate.check_config(config)
  assert validate.schedule_shortfall(config) is None


def _every_300(end_pruning_step=-1):
  config = defaults.get_config()
  config.pruning = defaults.pruning_config(
    config.pruning,
    begin_pruning_step=0,
    end_pruning_step=end_pruning_step,
    pruning_frequency=300,
    sparsity_function_begin_step=0,
    sparsity_function_end_step=1000,
    target_sparsity=0.5,
    sparsity_function_exponent=1.0,
  )
  return config


def test_updates_count_from_the_last_one_not_on_a_grid():
  config = _every_300()
  # Updates at 300, 600, 900 (max(begin, frequency), then every 300): s(900) = 0.45;
  # the target needs the update at 1200.
  config.num_steps = 1000
  assert validate.schedule_shortfall(config) == (
    'config.num_steps=1000 stops the mask updates at step 900, where the schedule is at 45.0% '
    'sparsity, short of target_sparsity=0.5 (reached at sparsity_function_end_step=1000, by '
    'the update at step 1200); set num_steps above 1200, or end the schedule earlier.'
  )
  config.num_steps = 1201
  assert validate.schedule_shortfall(config) is None
  # A window that ends at the schedule's end still misses its last update.
  config = _every_300(end_pruning_step=1000)
  config.num_steps = 3000
  assert validate.schedule_shortfall(config) == (
    'config.pruning.end_pruning_step=1000 stops the mask updates at step 900, where the '
    'schedule is at 45.0% sparsity, short of target_sparsity=0.5 (reached at '
    'sparsity_function_end_step=1000, by the update at step 1200); set end_pruning_step=1200 '
    'or later, or end the schedule earlier.'
  )


def test_channels_without_pruning_is_refused():
  config = defaults.get_config()
  config.channels.enabled = True
  validate.check_config(config)
  config.prune = False
  with pytest.raises(
    ConfigError,
    match=r'^config.channels.enabled=True prunes whole channels, '
    'but config.prune=False trains the dense model only',
  ):
    validate.check_config(config)


def test_an_empty_map_given_as_a_list_equals_the_default():
  # --config.pruning.weight_sparsity_map="[]" gives (): the same run as the default ('',).
  assert defaults.pruning_config(weight_sparsity_map=()).weight_sparsity_map == ('',)
