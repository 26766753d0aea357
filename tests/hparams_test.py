"""Hyperparameters: TF names and defaults, string parsing, validation errors and warnings."""

import signal

import docs_blocks
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pruning_helpers as helpers
import pytest

import jaxprune
from jaxprune._config import hparams as hparams_lib

TF_DEFAULTS = {
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
}


def test_defaults_are_tfs():
  hp = jaxprune.get_pruning_hparams()
  assert isinstance(hp, ml_collections.ConfigDict)
  for name, value in TF_DEFAULTS.items():
    assert hp[name] == value, name
  assert hp.threshold_method == 'histogram'
  assert hp.weight_name_regex == '(kernel|embedding)$'


def test_types_are_fixed_by_defaults():
  hp = jaxprune.get_pruning_hparams()
  with pytest.raises(TypeError):
    hp.nbins = 2.5


def test_parse_tf_string_syntax():
  hp = jaxprune.parse_hparams(
    'target_sparsity=0.9,pruning_frequency=100,'
    'weight_sparsity_map=[conv1:0.8,dense/kernel:0.95],block_dims_map=[dense1:4x4],'
    'use_tpu=true'
  )
  assert hp.target_sparsity == 0.9
  assert hp.pruning_frequency == 100
  assert hp.use_tpu is True
  assert hparams_lib.sparsity_map(hp) == [('conv1', 0.8), ('dense/kernel', 0.95)]
  assert hparams_lib.block_dims_map(hp) == [('dense1', (4, 4))]


def test_parse_on_top_of_base_does_not_modify_it():
  base = jaxprune.parse_hparams('target_sparsity=0.7')
  hp = jaxprune.parse_hparams('nbins=64', base=base)
  assert (hp.target_sparsity, hp.nbins) == (0.7, 64)
  assert base.nbins == 256


def test_map_value_is_after_the_last_colon():
  hp = jaxprune.parse_hparams('weight_sparsity_map=[a:b/kernel:0.3],block_dims_map=[x:y:-1x2]')
  assert hparams_lib.sparsity_map(hp) == [('a:b/kernel', 0.3)]
  assert hparams_lib.block_dims_map(hp) == [('x:y', (-1, 2))]


def test_empty_map_entries_are_dropped():
  hp = jaxprune.parse_hparams('weight_sparsity_map=[]')
  assert hparams_lib.sparsity_map(hp) == []


def test_unknown_name_lists_known_names():
  with pytest.raises(ValueError, match="unknown hyperparameter 'target_sparsty'.*target_sparsity"):
    jaxprune.parse_hparams('target_sparsty=0.9')


@pytest.mark.parametrize(
  'text, field',
  [
    ('begin_pruning_step=-1', 'begin_pruning_step'),
    ('begin_pruning_step=5,end_pruning_step=5', 'end_pruning_step'),
    ('end_pruning_step=-2', 'end_pruning_step'),
    ('sparsity_function_begin_step=-1', 'sparsity_function_begin_step'),
    ('sparsity_function_begin_step=100', 'sparsity_function_end_step'),
    ('threshold_decay=1.0', 'threshold_decay'),
    ('initial_sparsity=-0.1', 'initial_sparsity'),
    ('target_sparsity=1.0', 'target_sparsity'),
    ('weight_sparsity_map=[conv1:1.2]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[conv1:abc]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[conv1]', 'weight_sparsity_map'),
    ('weight_sparsity_map=[(:0.5]', 'weight_sparsity_map'),
    ('nbins=1', 'nbins'),
    ('pruning_frequency=0', 'pruning_frequency'),
    ('block_height=0', 'block_height'),
    ('block_width=-2', 'block_width'),
    ('block_dims_map=[dense:0x2]', 'block_dims_map'),
    ('block_dims_map=[dense:2]', 'block_dims_map'),
    ('block_pooling_function=MIN', 'block_pooling_function'),
    ('threshold_method=sort', 'threshold_method'),
    ('weight_name_regex=(', 'weight_name_regex'),
    ('nm_sparsity=4:2', 'nm_sparsity'),
    ('nm_sparsity_map=[dense:2]', 'nm_sparsity_map'),
    ('name=', 'name'),
    ('weight_name_regex=', "weight_name_regex='': must not be empty"),
    ('mask_search=gpu', 'mask_search'),
  ],
)
def test_each_validation_rule_names_its_field(text, field):
  with pytest.raises(ValueError, match=field):
    jaxprune.parse_hparams(text)


def test_bad_value_type_names_the_field():
  with pytest.raises(ValueError, match='nbins'):
    jaxprune.parse_hparams('nbins=2.5')


def test_pooling_is_case_insensitive():
  assert jaxprune.parse_hparams('block_pooling_function=max').block_pooling_function == 'max'


def test_validation_through_pruning():
  hp = jaxprune.get_pruning_hparams()
  hp.target_sparsity = 1.5
  with pytest.raises(ValueError, match='target_sparsity=1.5'):
    jaxprune.pruning(hp)


def test_global_pruning_rejects_per_variable_targets():
  with pytest.raises(ValueError, match='global_pruning'):
    jaxprune.parse_hparams('global_pruning=true,weight_sparsity_map=[a:0.5]')


def test_parse_then_pruning_checks_and_warns_once():
  # The documented path (docs/guides/gradual.md): parse_hparams checks and warns, and
  # pruning(hp) does not repeat it for the config parse_hparams froze.
  def make():
    hp = jaxprune.parse_hparams('end_pruning_step=50')
    jaxprune.pruning(hp)
    jaxprune.pruning(hp)

  messages = helpers.warnings_of(make)
  assert len(messages) == 1
  assert 'end_pruning_step=50 stops mask updates' in messages[0]


def test_a_config_changed_after_freezing_is_checked_again():
  hp = jaxprune.parse_hparams('target_sparsity=0.8')
  hp.target_sparsity = 1.5
  with pytest.raises(ValueError, match='target_sparsity=1.5'):
    jaxprune.pruning(hp)
  hp = jaxprune.parse_hparams('weight_sparsity_map=[a:0.5]')
  hp.weight_sparsity_map.append('b:1.5')  # a list edited in place is a change too
  with pytest.raises(ValueError, match='weight_sparsity_map entry b:1.5'):
    jaxprune.pruning(hp)
  with pytest.warns(UserWarning, match='end_pruning_step=50'):
    hp = jaxprune.parse_hparams('end_pruning_step=50')
  hp.end_pruning_step = 40
  assert len(helpers.warnings_of(lambda: jaxprune.pruning(hp))) == 1


def test_pruning_accepts_a_string():
  # Before: AttributeError: 'str' object has no attribute 'keys'.
  params = {
    'd': {'kernel': jnp.asarray(np.linspace(1, 100, 100, dtype=np.float32).reshape(10, 10))}
  }
  tx = jaxprune.pruning('target_sparsity=0.9,pruning_frequency=1,sparsity_function_end_step=1')
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(2):
    _, state = update(zeros, state, params)
  # docs/explanation/semantics.md#reference-numbers: linspace(1, 100, 100) at s = 0.9 keeps 11
  # weights (threshold 89.84375).
  assert int(state.masks['d']['kernel'].sum()) == 11
  assert hparams_lib.freeze('nbins=64').nbins == 64


def test_a_value_that_is_not_hparams_is_a_type_error():
  with pytest.raises(TypeError, match='parse_hparams'):
    jaxprune.pruning(0.9)


def test_hparams_made_directly_are_checked():
  assert hparams_lib.HParams(target_sparsity=0.8).target_sparsity == 0.8
  with pytest.raises(ValueError, match='nbins=1: must be in'):
    hparams_lib.HParams(nbins=1)
  with pytest.raises(ValueError, match='block_dims_map entry'):
    hparams_lib.HParams(block_dims_map=('a:2',))


def test_check_value_prefixes_where():
  with pytest.raises(ValueError, match=r'^update_mask: nbins=1: must be in \[2, 2\*\*24\]'):
    hparams_lib.check_value('nbins', 1, where='update_mask')
  assert hparams_lib.check_value('threshold_decay', 0) == 0.0


def test_begin_after_the_schedule_ends_warns_one_shot():
  # Before: silently one-shot, the first update (step 1000) already at the target.
  messages = helpers.warnings_of(lambda: jaxprune.parse_hparams('begin_pruning_step=1000'))
  assert len(messages) == 1
  assert (
    'first mask update is at step max(begin_pruning_step, pruning_frequency) = 1000'
    in (messages[0])
  )
  assert 'sparsity_function_end_step=100' in messages[0]
  # The same through a frequency longer than the schedule.
  assert len(helpers.warnings_of(lambda: jaxprune.parse_hparams('pruning_frequency=101'))) == 1


@pytest.mark.parametrize(
  'text',
  [
    '',  # first update at 10, schedule ends at 100
    'pruning_frequency=1,sparsity_function_end_step=1',  # one-shot on purpose
    'begin_pruning_step=1000,sparsity_function_begin_step=1000,sparsity_function_end_step=2000',
    'begin_pruning_step=1000,sparsity_function_end_step=1000',  # the fix the warning names
  ],
)
def test_schedules_inside_the_window_do_not_warn(text):
  assert helpers.warnings_of(lambda: jaxprune.parse_hparams(text)) == []


def test_exponent_that_float32_flushes_to_zero_is_refused():
  # Before: 1e-39 passed the > 0 check; inside jit the float32 schedule flushes it
  # to 0, (1 - p) ** 0 == 1, and the sparsity never leaves initial_sparsity.
  smallest_normal = float(np.finfo(np.float32).tiny)  # 2**-126
  for exponent in (1e-39, 1e-45, smallest_normal / 2):
    with pytest.raises(ValueError, match=r'sparsity_function_exponent=.*smallest normal float32'):
      jaxprune.pruning({'sparsity_function_exponent': exponent})
  frozen = hparams_lib.freeze({'sparsity_function_exponent': smallest_normal})
  # At the smallest normal exponent the schedule still reaches the target at its end.
  assert float(jax.jit(lambda t: jaxprune.sparsity_at(frozen, t))(100)) == 0.5


# P(|z| < 5 / nbins) for a standard normal z, the share of the weights in the
# lowest histogram bin when the largest weight is 5 standard deviations (about
# 10**6 normal weights): erf(5 / (nbins * sqrt(2))), from a table of erf.
LOWEST_BIN_AT_5_STD = {2: 0.988, 3: 0.904, 4: 0.789, 5: 0.683, 6: 0.595, 7: 0.525, 8: 0.468}


@pytest.mark.parametrize('nbins', range(2, 9))
def test_few_bins_warn_when_a_target_cannot_prune(nbins):
  """nbins 2-7 leave more than half of such weights in the lowest bin: a 50% target prunes none."""
  parse = lambda target: jaxprune.parse_hparams(f'nbins={nbins},target_sparsity={target}')  # noqa: E731
  messages = helpers.warnings_of(lambda: parse(0.5))
  assert len(messages) == (1 if LOWEST_BIN_AT_5_STD[nbins] >= 0.5 else 0)
  at_90 = helpers.warnings_of(lambda: parse(0.9))
  assert len(at_90) == (1 if LOWEST_BIN_AT_5_STD[nbins] >= 0.9 else 0)
  exact = f'nbins={nbins},target_sparsity=0.5,threshold_method=exact'
  assert helpers.warnings_of(lambda: jaxprune.parse_hparams(exact)) == []


def test_few_bins_warning_states_the_shares_and_a_fix():
  (message,) = helpers.warnings_of(lambda: jaxprune.parse_hparams('nbins=4,target_sparsity=0.6'))
  # P(|z| < 1) = 68.3% (max 4 std), P(|z| < 1.25) = 78.9% (max 5 std).
  assert 'that bin holds 68.3% to 78.9%' in message
  assert 'target sparsity 0.6 can prune nothing' in message
  # nbins=6 is the first with P(|z| < 5/6) = 59.5% < 60%.
  assert 'Use nbins >= 6' in message


def _within_seconds(seconds, make):
  """`make()`, failed as a hang when it runs longer than `seconds` (the test's own alarm)."""

  def hang(signum, frame):
    raise TimeoutError(f'still running after {seconds} s')

  previous = signal.signal(signal.SIGALRM, hang)
  signal.alarm(seconds)
  try:
    return make()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
  'text',
  [
    'target_sparsity=1e-7',
    'target_sparsity=1e-9',
    'target_sparsity=1e-45',
    'weight_sparsity_map=[Dense_0:1e-9]',
  ],
)
def test_tiny_targets_return_at_once(text):
  """No nbins in [2, 2**24] puts less than 1e-7 of the weights in the lowest bin
  (erf(5 / (2**24 sqrt 2)) = 2.4e-7): the warning says so, and says it at once."""
  for make in (
    jaxprune.parse_hparams,
    jaxprune.pruning,
    lambda t: jaxprune.pruned(optax.sgd(0.1), t),
  ):
    (message,) = _within_seconds(2, lambda m=make: helpers.warnings_of(lambda: m(text)))
    assert "No nbins up to 16777216 (2**24) reaches it: use threshold_method='exact'." in message


def test_a_small_target_names_the_bins_that_reach_it():
  # erf(5 / (n sqrt 2)) < 1e-3 first at n = 3990 (erf(5 / (3989 sqrt 2)) = 1.00013e-3).
  (message,) = helpers.warnings_of(lambda: jaxprune.parse_hparams('target_sparsity=0.001'))
  assert 'Use nbins >= 3990' in message


def test_few_bins_prune_nothing_on_normal_weights():
  """The warning's claim, on 10**4 normal weights: nbins=4 at 60% prunes nothing."""
  w = np.random.default_rng(0).standard_normal((100, 100)).astype(np.float32)
  a = np.abs(w)
  assert np.mean(a < a.max() / 4) >= 0.6  # the lowest bin holds the target share
  with pytest.warns(UserWarning, match='nbins=4'):
    hp = jaxprune.parse_hparams('nbins=4,target_sparsity=0.6')
  _, mask = jax.jit(lambda w: jaxprune.update_mask(w, 0.0, 0.6, nbins=hp.nbins))(w)
  assert bool(mask.all())


def test_docs_hparams_example_runs_without_warnings():
  (block,) = docs_blocks.code_cells('guides/gradual.md', start="Hyperparameters keep TF's names")
  namespace = {'jaxprune': jaxprune}
  assert helpers.warnings_of(lambda: exec(block, namespace)) == []  # noqa: S102
  frozen = hparams_lib.freeze(namespace['hp'])
  assert frozen is hparams_lib.freeze(namespace['hp'])  # frozen once, by parse_hparams
  assert frozen.sparsity_entries == (('conv1', 0.8), ('dense/kernel', 0.95))
  assert frozen.block_entries == (('dense1', (4, 4)),)


@pytest.mark.parametrize(
  'field, value, message',
  [
    ('sparsity_function_exponent', float('nan'), 'finite'),
    ('sparsity_function_exponent', -3.0, 'must be > 0'),
    ('sparsity_function_exponent', 0.0, 'must be > 0'),
    ('begin_pruning_step', 3_000_000_000, 'int32'),
    ('sparsity_function_end_step', 2**31, 'int32'),
    ('nbins', 2**31, 'int32'),
    ('nbins', 2**24 + 1, r'\[2, 2\*\*24\]'),
    ('block_height', 3_000_000_000, 'int32'),
    ('pruning_frequency', True, 'must be an integer'),
    ('nbins', None, 'must be an integer'),
    ('target_sparsity', None, 'must be a number'),
    ('threshold_method', None, 'must be a string'),
    ('weight_sparsity_map', None, 'list'),
    ('global_pruning', 1, 'True or False'),
  ],
)
def test_field_types_and_int32_limits(field, value, message):
  hparams = jaxprune.get_pruning_hparams().to_dict()  # a plain dict: no type checks of its own
  hparams[field] = value
  with pytest.raises(ValueError, match=f'{field}=.*{message}'):
    jaxprune.pruning(hparams)


def test_none_in_a_config_dict_names_the_field():
  hparams = jaxprune.get_pruning_hparams()
  hparams.nbins = None  # ConfigDict accepts None in any field
  with pytest.raises(ValueError, match='nbins=None: must be an integer'):
    jaxprune.pruning(hparams)


def test_block_map_beyond_int32_is_rejected():
  with pytest.raises(ValueError, match='block_dims_map entry.*2\\*\\*31'):
    jaxprune.parse_hparams('block_dims_map=[kernel:3000000000x1]')


def test_a_name_given_twice_is_an_error():
  with pytest.raises(ValueError, match='target_sparsity is assigned twice'):
    jaxprune.parse_hparams('target_sparsity=0.5,target_sparsity=0.9')


def test_misspelled_field_is_refused_with_the_right_name():
  hparams = jaxprune.get_pruning_hparams()
  with pytest.raises(AttributeError, match='target_sparsity'):
    hparams.target_sparisty = 0.95
  unlocked = ml_collections.ConfigDict({'target_sparisty': 0.95})
  with pytest.raises(ValueError, match="'target_sparisty': did you mean 'target_sparsity'"):
    jaxprune.pruning(unlocked)


def test_a_partial_config_takes_the_other_defaults():
  frozen = hparams_lib.freeze(ml_collections.ConfigDict({'target_sparsity': 0.8}))
  assert (frozen.target_sparsity, frozen.nbins, frozen.threshold_method) == (0.8, 256, 'histogram')


def test_tfmot_m_by_n_is_translated_not_misread():
  with pytest.raises(ValueError, match="m ZEROS in every n.*nm_sparsity='<n-m>:<n>'"):
    jaxprune.parse_hparams('sparsity_m_by_n=1:4')
  # nm_sparsity keeps N of every M: 1:4 is 75% sparse, 3:4 is tfmot's (1, 4).
  w = jnp.asarray(np.arange(1, 33, dtype=np.float32).reshape(8, 4))
  for text, kept in (('1:4', 8), ('3:4', 24)):
    tx = jaxprune.pruning(helpers.hparams(nm_sparsity=text, **helpers.ONE_SHOT))
    state = helpers.run_updates(tx, {'d': {'kernel': w}}, 2)
    assert int(state.masks['d']['kernel'].sum()) == kept


def test_window_that_can_never_update_is_an_error():
  with pytest.raises(
    ValueError,
    match=r'end_pruning_step=5: comes before the first mask update'
    r', at step .* = 10',
  ):
    jaxprune.parse_hparams('pruning_frequency=10,end_pruning_step=5')


def test_stopping_before_the_schedule_ends_warns():
  with pytest.warns(
    UserWarning,
    match='end_pruning_step=50 stops mask updates before sparsity_function_end_step=100',
  ):
    jaxprune.parse_hparams('end_pruning_step=50')


def test_parse_hparams_takes_fields_by_keyword():
  """The README offers hparams "as a jaxprune.parse_hparams(...) config": keywords too."""
  hp = jaxprune.parse_hparams(target_sparsity=0.8, weight_sparsity_map=['Dense_0:0.5'])
  assert (hp.target_sparsity, list(hp.weight_sparsity_map)) == (0.8, ['Dense_0:0.5'])
  both = jaxprune.parse_hparams('nbins=64', base=hp, pruning_frequency=5)
  assert (both.target_sparsity, both.nbins, both.pruning_frequency) == (0.8, 64, 5)
  with pytest.raises(
    ValueError,
    match=r'^parse_hparams: target_sparsity is given twice \(target_sparsity=0.9 in the text '
    r'and target_sparsity=0.8 by keyword\)',
  ):
    jaxprune.parse_hparams('target_sparsity=0.9', target_sparsity=0.8)
  with pytest.raises(
    ValueError,
    match=r"^parse_hparams: unknown hyperparameter 'target_sparsty': did you mean "
    r"'target_sparsity'",
  ):
    jaxprune.parse_hparams(target_sparsty=0.8)
  with pytest.raises(ValueError, match=r'^parse_hparams: target_sparsity=1.2: must be in \[0, 1\)'):
    jaxprune.parse_hparams(target_sparsity=1.2)
  with pytest.raises(
    TypeError, match=r'give fields by keyword as parse_hparams\(target_sparsity=0.8\)'
  ):
    jaxprune.parse_hparams({'target_sparsity': 0.8})
