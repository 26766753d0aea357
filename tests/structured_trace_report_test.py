"""summary() and the tabulate helpers, on the zoo MLP (10-16-8-4, batch 2)."""

import pytest
import structured_zoo as zoo

import jaxprune.structured as structured


@pytest.fixture(scope='module')
def graph():
  fn, variables, args, _ = zoo.mlp()
  return structured.trace(fn, variables, *args)


def _group(graph, leaf, axis):
  return graph.leaf_axes[leaf][axis][0].group_id


def test_summary(graph):
  lines = graph.summary().splitlines()
  # groups: hidden 16, hidden 8, input features 10, logits 4, batch 2.
  assert lines[0] == '5 groups, 40 channels; prunable: 2 groups, 24 channels (60.0%)'
  assert lines[1] == 'FLOPs (dot_general + conv): 1.28e+03'
  assert lines[2] == 'unprunable: reaches model input: 2, reaches model output: 1'
  assert lines[3] == 'blocked primitives: none'
  hidden1 = _group(graph, 'params/fc1/kernel', 1)
  row = next(line for line in lines[5:] if line.startswith(f'{hidden1} '))
  assert row.split()[:3] == [str(hidden1), '16', '72']
  assert row.endswith('params/fc1/kernel:1, params/fc2/kernel:0, ... (+1)')


def test_group_table(graph):
  text = graph.group_table(_group(graph, 'params/fc2/kernel', 1))
  lines = text.splitlines()
  assert lines[0].endswith('8 channels, prunable, 80 FLOPs/channel')
  rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
  assert rows == {
    'params/fc2/bias': ['0', '8', '1', '0'],
    'params/fc2/kernel': ['1', '8', '1', '0'],
    'params/fc3/kernel': ['0', '8', '1', '0'],
  }


def test_leaf_table(graph):
  lines = graph.leaf_table('params/fc2/kernel').splitlines()
  assert lines[0] == 'params/fc2/kernel (16, 8)'
  assert lines[3].split() == [
    '0',
    '16',
    f'{_group(graph, "params/fc1/kernel", 1)}',
    '(16)',
    'prunable',
  ]
  assert lines[4].split() == [
    '1',
    '8',
    f'{_group(graph, "params/fc2/kernel", 1)}',
    '(8)',
    'prunable',
  ]


def test_unprunable_table(graph):
  lines = graph.unprunable_table().splitlines()
  reasons = sorted(line.split(None, 2)[2].split('  ')[0] for line in lines[2:])
  assert reasons == [
    'reaches model input 0 axis 0',
    'reaches model input 0 axis 1',
    'reaches model output 0 axis 1',
  ]


def test_bad_names_are_errors(graph):
  with pytest.raises(ValueError, match='group_id=99 is out of range'):
    graph.group_table(99)
  with pytest.raises(ValueError, match="leaf_name='fc1/kernel' is not a variables leaf"):
    graph.leaf_table('fc1/kernel')
