"""The hyperparameters as text: TF's HParams string and the 'regex:value' maps."""

import jax.numpy as jnp
import optax
import pytest

import jaxprune
from jaxprune import oneshot, sparse
from jaxprune._config import maps as maps


def test_split_top_level_keeps_bracketed_lists_whole():
  assert maps.split_top_level(' a=1, b=[x:1,y:2] ,,c=[] ') == ['a=1', 'b=[x:1,y:2]', 'c=[]']
  for text in ('a=[x', 'a=x]'):
    with pytest.raises(ValueError, match='unbalanced'):
      maps.split_top_level(text)


@pytest.mark.parametrize(
  'raw, default, expected',
  [
    ('[a:1, b:2]', [''], ['a:1', 'b:2']),
    ('[]', [''], ['']),
    ('TRUE', False, True),
    ('0', True, False),
    ('-1', 0, -1),
    ('1e-3', 0.0, 0.001),
    ('exact', 'histogram', 'exact'),
  ],
)
def test_convert_follows_the_type_of_the_default(raw, default, expected):
  assert maps.convert('f', raw, default) == expected


@pytest.mark.parametrize(
  'raw, default, message',
  [
    ('a:1', [''], 'bracketed list'),
    ('yes', False, 'true or false'),
    ('2.5', 0, 'integer'),
    ('half', 0.0, 'number'),
  ],
)
def test_convert_names_the_field_and_the_expected_form(raw, default, message):
  with pytest.raises(ValueError, match=f'f={raw!r} must be .*{message}'):
    maps.convert('f', raw, default)


def test_each_map_parses_its_values():
  hp = {
    'weight_sparsity_map': ['', 'a:b:0.25'],
    'block_dims_map': ['dense:4X-1'],
    'nm_sparsity_map': ['x:y:2:4'],
    'layer_axes_map': ['h/:2'],
  }
  assert maps.sparsity_map(hp) == [('a:b', 0.25)]
  assert maps.block_dims_map(hp) == [('dense', (4, -1))]
  assert maps.nm_map(hp) == [('x:y', (2, 4))]
  assert maps.layer_axes_map(hp) == [('h/', 2)]


@pytest.mark.parametrize(
  'field, entry, message',
  [
    ('layer_axes_map', 'h:01', 'integer >= 1'),
    ('layer_axes_map', 'h:0', 'integer >= 1'),
    ('block_dims_map', 'd:2x0', r'\[1, 2\*\*31 - 1\] or -1'),
    ('nm_sparsity_map', 'd:2', 'regex:N:M'),
    ('weight_sparsity_map', '[:0.5', 'invalid regex'),
  ],
)
def test_bad_entries_name_the_map_and_entry(field, entry, message):
  parse = {
    'layer_axes_map': maps.layer_axes_map,
    'block_dims_map': maps.block_dims_map,
    'nm_sparsity_map': maps.nm_map,
    'weight_sparsity_map': maps.sparsity_map,
  }[field]
  with pytest.raises(ValueError, match=f'{field} entry.*{message}'):
    parse({field: [entry]})


def test_match_entries_is_the_rule_of_every_map():
  names = ['Dense_0/kernel', 'Dense_1/kernel', 'Embed_0/embedding']
  values, unmatched = maps.match_entries(
    'm', names, [('Dense_0', 0.5), ('embedding', 0.1), ('Conv', 0.3)]
  )
  assert values == {'Dense_0/kernel': 0.5, 'Embed_0/embedding': 0.1}
  assert unmatched == ['Conv']
  with pytest.raises(ValueError, match=r"^m: layer 'Dense_0/kernel' matches several entries "):
    maps.match_entries('m', names, [('Dense', 0.5), ('kernel', 0.1)], kind='layer')
  with pytest.warns(UserWarning, match=r"m entry 'Conv' matches none of the leaves, which are "):
    maps.warn_unmatched(["m entry 'Conv'"], names, 'leaves')


def test_pruning_sparse_and_oneshot_share_the_map_rule():
  """Several matching entries: an error naming the leaf and the entries; an entry that
  matches nothing: a warning naming it and the names it was matched against."""
  params = {'Dense_0': {'kernel': jnp.ones((4, 2))}}
  batches = [jnp.ones((3, 4))]

  def model(p, x):
    return x @ p['Dense_0']['kernel']

  several = [
    lambda: jaxprune.pruning(weight_sparsity_map=['Dense:0.5', 'kernel:0.6']).init(params),
    lambda: sparse.static(optax.sgd(0.1), 0.5, sparsity_map={'Dense': 0.5, 'kernel': 0.6}).init(
      params
    ),
    lambda: oneshot.prune(
      model,
      params,
      batches,
      method='magnitude',
      sparsity=0.5,
      overrides={'Dense': 0.5, 'kernel': 0.6},
    ),
  ]
  for call in several:
    with pytest.raises(ValueError, match=r"'Dense_0/kernel' matches several entries \['Dense',"):
      call()
  nothing = [
    (
      lambda: jaxprune.pruning(weight_sparsity_map=['Conv:0.5']).init(params),
      'weight_sparsity_map',
    ),
    (
      lambda: sparse.static(optax.sgd(0.1), 0.5, sparsity_map={'Conv': 0.5}).init(params),
      'sparsity_map',
    ),
    (
      lambda: oneshot.prune(
        model, params, batches, method='magnitude', sparsity=0.5, overrides={'Conv': 0.5}
      ),
      'overrides',
    ),
  ]
  for call, field in nothing:
    with pytest.warns(
      UserWarning,
      match=rf"{field} entry 'Conv' matches none of the .*, which "
      r"are \['Dense_0/kernel'\]",
    ):
      call()
