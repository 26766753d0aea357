"""What the user set is recorded as set (`HParams.given`), never inferred from a value equal
to its default: by keyword, in TF's text, assigned in a config, or by a command-line flag."""

import copy
import pickle
import sys

import ml_collections
import optax
import pytest
from absl import flags
from ml_collections import config_flags

import jaxprune
from jaxprune._config import hparams as hparams_lib

# target_sparsity's default is 0.5: each way of setting it sets it to exactly that.
_NM_REFUSED = (
  r"^nm_sparsity='2:4' keeps 2 of every 4 weights of each pruned leaf \(50% sparse\), so "
  r'target_sparsity=0.5 would be dropped: give a target or nm_sparsity, not both'
)


def _by_flag(*argv):
  """The pruning config after ml_collections' command-line overrides `argv`."""
  flag_values = flags.FlagValues()
  holder = config_flags.DEFINE_config_dict(
    'config', jaxprune.get_pruning_hparams(), flag_values=flag_values, sys_argv=['prog', *argv]
  )
  flag_values(['prog', *argv])
  return holder.value


def _assigned():
  hparams = jaxprune.get_pruning_hparams()
  hparams.target_sparsity = 0.5
  return hparams


_WAYS = {
  'keyword': lambda: hparams_lib.with_fields(None, {'target_sparsity': 0.5}),
  'text': lambda: jaxprune.parse_hparams('target_sparsity=0.5'),
  'parse keyword': lambda: jaxprune.parse_hparams(target_sparsity=0.5),
  'config attribute': _assigned,
  'config item': lambda: _item(jaxprune.get_pruning_hparams()),
  'dict': lambda: {'target_sparsity': 0.5},
  'plain ConfigDict': lambda: ml_collections.ConfigDict({'target_sparsity': 0.5}),
  'flag': lambda: _by_flag('--config.target_sparsity=0.5'),
  'HParams': lambda: hparams_lib.HParams(target_sparsity=0.5),
}


def _item(hparams):
  hparams['target_sparsity'] = 0.5
  return hparams


@pytest.mark.parametrize('way', list(_WAYS))
def test_a_field_set_to_its_default_is_given(way):
  frozen = hparams_lib.freeze(_WAYS[way]())
  assert frozen.target_sparsity == 0.5
  assert frozen.given == {'target_sparsity'}


@pytest.mark.parametrize(
  'unset',
  [
    lambda: jaxprune.get_pruning_hparams(),
    lambda: jaxprune.parse_hparams(''),
    lambda: jaxprune.parse_hparams('nbins=256'),
    lambda: _by_flag(),
    lambda: _by_flag('--config.nbins=256'),
    lambda: hparams_lib.HParams(),
    lambda: {},
  ],
  ids=['defaults', 'empty text', 'another field', 'no flag', 'another flag', 'HParams', 'dict'],
)
def test_a_field_not_set_is_not_given(unset):
  frozen = hparams_lib.freeze(unset())
  assert 'target_sparsity' not in frozen.given
  assert frozen.given <= {'nbins'}


@pytest.mark.parametrize('way', [w for w in _WAYS if w != 'keyword'])
def test_nm_sparsity_beside_an_explicit_default_target_is_refused(way):
  hparams = _WAYS[way]()
  with pytest.raises(ValueError, match=_NM_REFUSED):
    jaxprune.pruning(hparams, nm_sparsity='2:4')
  with pytest.raises(ValueError, match=_NM_REFUSED):
    jaxprune.pruned(optax.sgd(0.1), hparams, nm_sparsity='2:4')


def test_nm_sparsity_beside_a_default_target_by_keyword_text_or_config_is_refused():
  with pytest.raises(ValueError, match=_NM_REFUSED) as error:
    jaxprune.pruned(optax.sgd(0.1), target_sparsity=0.5, nm_sparsity='2:4')
  assert '\n' not in str(error.value)
  with pytest.raises(ValueError, match=_NM_REFUSED):
    jaxprune.parse_hparams('target_sparsity=0.5,nm_sparsity=2:4')
  hparams = _assigned()
  hparams.nm_sparsity = '2:4'
  with pytest.raises(ValueError, match=_NM_REFUSED):
    hparams_lib.freeze(hparams)
  with pytest.raises(ValueError, match=_NM_REFUSED):
    hparams_lib.freeze(_by_flag('--config.target_sparsity=0.5', '--config.nm_sparsity=2:4'))


def test_nm_sparsity_alone_is_accepted():
  assert hparams_lib.freeze(jaxprune.parse_hparams('nm_sparsity=2:4')).nm == (2, 4)
  assert hparams_lib.freeze(_by_flag('--config.nm_sparsity=2:4')).nm == (2, 4)
  hparams = jaxprune.get_pruning_hparams()
  hparams.nm_sparsity = '2:4'
  assert hparams_lib.freeze(hparams).given == {'nm_sparsity'}
  jaxprune.pruning(None, nm_sparsity='2:4')


def test_assigning_a_frozen_config_again_is_seen():
  hparams = jaxprune.parse_hparams('nm_sparsity=2:4')
  assert hparams_lib.freeze(hparams).nm == (2, 4)
  hparams.target_sparsity = 0.5  # the value it already holds
  with pytest.raises(ValueError, match=_NM_REFUSED):
    hparams_lib.freeze(hparams)


def test_copies_keep_what_was_given():
  hparams = _assigned()
  for copied in (
    copy.copy(hparams),
    copy.deepcopy(hparams),
    pickle.loads(pickle.dumps(hparams)),
    hparams.copy_and_resolve_references(),
  ):
    assert hparams_lib.given_fields(copied) == {'target_sparsity'}


def test_parse_hparams_on_a_base_adds_to_its_given_fields():
  base = jaxprune.parse_hparams('nbins=256')
  parsed = jaxprune.parse_hparams('initial_sparsity=0.0', base=base, use_tpu=False)
  assert hparams_lib.given_fields(parsed) == {'nbins', 'initial_sparsity', 'use_tpu'}


def test_a_keyword_sets_what_a_config_does_not_set_even_at_the_same_value():
  frozen = hparams_lib.with_fields(jaxprune.parse_hparams('nbins=512'), {'target_sparsity': 0.9})
  assert frozen.target_sparsity == 0.9 and frozen.given == {'nbins', 'target_sparsity'}
  # A config that sets target_sparsity to its default's value has set it.
  with pytest.raises(ValueError, match=r'^target_sparsity is given twice, target_sparsity=0.5'):
    hparams_lib.with_fields(_assigned(), {'target_sparsity': 0.9})


def test_given_is_not_part_of_the_settings_equality():
  given, default = hparams_lib.HParams(target_sparsity=0.5), hparams_lib.HParams()
  assert given == default and given.given != default.given


def test_an_unknown_given_field_is_named():
  with pytest.raises(ValueError, match="unknown hyperparameter 'target_sparisty'"):
    hparams_lib.HParams(given=frozenset({'target_sparisty'}))


def test_the_job_reads_what_the_flags_set_from_them_not_from_sys_argv(monkeypatch):
  from jaxprune_train import _defaults, _main

  monkeypatch.setattr(sys, 'argv', ['jaxprune-train'])
  # As the flags --config.pruning.target_sparsity=0.5 --config.pruning.nm_sparsity=2:4 do.
  config = _defaults.get_config()
  config.pruning.target_sparsity = 0.5
  config.pruning.nm_sparsity = '2:4'
  by_flags = {'target_sparsity': 0.5, 'nm_sparsity': '2:4'}
  assert _main._resolve_pruning(config, by_flags, '') == (
    "nm_sparsity='2:4' keeps 2 of every 4 weights of each pruned leaf (50% sparse), so "
    'target_sparsity=0.5 would be dropped: give a target or nm_sparsity, not both '
    '(nm_sparsity_map=[regex:2:4] puts N:M on some leaves and leaves the target to the others).'
  )
  # N:M alone on the command line takes the place of the config file's target (0.9).
  config = _defaults.get_config()
  config.pruning.nm_sparsity = '2:4'
  assert _main._resolve_pruning(config, {'nm_sparsity': '2:4'}, '') is None
  assert config.pruning.target_sparsity == 0.5
  assert 'target_sparsity' not in hparams_lib.given_fields(config.pruning)
  assert hparams_lib.freeze(config.pruning).nm == (2, 4)
  # The same through --pruning_hparams.
  config = _defaults.get_config()
  assert _main._resolve_pruning(config, {}, 'nm_sparsity=2:4') is None
  assert hparams_lib.freeze(config.pruning).given == {
    'begin_pruning_step',
    'end_pruning_step',
    'pruning_frequency',
    'sparsity_function_begin_step',
    'sparsity_function_end_step',
    'threshold_method',
    'nm_sparsity',
  }
