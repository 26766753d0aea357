"""The hyperparameters as text: TF's HParams string and the 'regex:value' maps."""

import pytest

from jaxprune import _maps as maps


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
