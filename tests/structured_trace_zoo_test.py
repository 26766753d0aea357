"""The test zoo: channel groups of small models, worked out by hand."""

import warnings

import numpy as np
import pytest
import structured_zoo as zoo

import jaxprune.structured as structured
from jaxprune.structured._primitives import table as primitives


def col(n):
  """Plain axis: channel c owns position c."""
  return np.arange(n)[:, None]


def group_with(graph, leaf, axis, k=1):
  """The group that owns `k` positions per channel of (leaf, axis)."""
  found = [
    g
    for g in graph.groups
    for m in g.members
    if (m.leaf, m.axis) == (leaf, axis) and m.indices.shape[1] == k
  ]
  assert len(found) == 1, (leaf, axis, found)
  return found[0]


def assert_group(group, expected, *, prunable=True, reason=None):
  got = {(m.leaf, m.axis): m.indices for m in group.members}
  assert sorted(got) == sorted(expected)
  for key, indices in expected.items():
    np.testing.assert_array_equal(got[key], indices, err_msg=str(key))
  assert group.size == len(next(iter(expected.values())))
  assert group.prunable == prunable
  assert group.reason == reason


def trace(case, **kwargs):
  fn, variables, args, _ = zoo.ZOO[case]()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    return structured.trace(fn, variables, *args, **kwargs)


def test_mlp():
  graph = trace('mlp')
  p = 'params/'
  hidden1 = group_with(graph, p + 'fc1/kernel', 1)
  assert_group(
    hidden1,
    {(p + 'fc1/kernel', 1): col(16), (p + 'fc1/bias', 0): col(16), (p + 'fc2/kernel', 0): col(16)},
  )
  hidden2 = group_with(graph, p + 'fc2/kernel', 1)
  assert_group(
    hidden2,
    {(p + 'fc2/kernel', 1): col(8), (p + 'fc2/bias', 0): col(8), (p + 'fc3/kernel', 0): col(8)},
  )
  assert_group(
    group_with(graph, p + 'fc1/kernel', 0),
    {(p + 'fc1/kernel', 0): col(10)},
    prunable=False,
    reason='reaches model input 0 axis 1',
  )
  assert_group(
    group_with(graph, p + 'fc3/kernel', 1),
    {(p + 'fc3/kernel', 1): col(4), (p + 'fc3/bias', 0): col(4)},
    prunable=False,
    reason='reaches model output 0 axis 1',
  )
  # FLOPs: 2*2*10*16 + 2*2*16*8 + 2*2*8*4; per channel of hidden1: 640/16 + 512/16.
  assert graph.total_flops == 1280
  assert hidden1.flops_per_channel == pytest.approx(72)
  assert hidden2.flops_per_channel == pytest.approx(512 / 8 + 128 / 8)
  assert [g.size for g in graph.prunable_groups] == [16, 8]
  assert graph.blocked_primitives == {}


def _bn(prefix, name, n):
  return {
    (f'params/{prefix}{name}/scale', 0): col(n),
    (f'params/{prefix}{name}/bias', 0): col(n),
    (f'batch_stats/{prefix}{name}/mean', 0): col(n),
    (f'batch_stats/{prefix}{name}/var', 0): col(n),
  }


@pytest.mark.parametrize('case', ['cnn_bn_eval', 'cnn_bn_train'])
def test_cnn_with_batchnorm(case):
  graph = trace(case)
  p = 'params/'
  first = group_with(graph, p + 'conv1/kernel', 3)
  assert_group(
    first,
    {
      (p + 'conv1/kernel', 3): col(8),
      (p + 'conv1/bias', 0): col(8),
      **_bn('', 'bn1', 8),
      (p + 'conv2/kernel', 2): col(8),
    },
  )
  second = group_with(graph, p + 'conv2/kernel', 3)
  assert_group(
    second,
    {
      (p + 'conv2/kernel', 3): col(16),
      (p + 'conv2/bias', 0): col(16),
      **_bn('', 'bn2', 16),
      (p + 'head/kernel', 0): col(16),
    },
  )
  assert len(graph.prunable_groups) == 2
  # conv1: 2*(2*8*8*8)*(3*3*3) = 55296; conv2 (stride 2): 2*(2*4*4*16)*(3*3*8) = 73728;
  # head 2*2*16*5 = 320.
  assert graph.total_flops == 55296 + 73728 + 320
  assert first.flops_per_channel == pytest.approx(55296 / 8 + 73728 / 8)
  assert second.flops_per_channel == pytest.approx(73728 / 16 + 320 / 16)
  spatial = group_with(graph, p + 'conv1/kernel', 0)
  assert spatial.reason == "spatial axis of 'conv_general_dilated'"
  assert group_with(graph, p + 'conv1/kernel', 2).reason == 'reaches model input 0 axis 3'


def test_train_mode_batch_stats_belong_to_their_variables():
  graph = trace('cnn_bn_train')
  assert graph.out_tree.num_leaves == 5  # the logits and four batch statistics
  reasons = {g.reason for g in graph.groups if g.reason}
  assert not any(r.startswith('reaches model output 1') for r in reasons)


def test_resnet_block_projection_shortcut():
  graph = trace('resnet_projection')
  p, b = 'params/', 'params/block/'
  stem = group_with(graph, p + 'stem/kernel', 3)
  assert_group(
    stem,
    {
      (p + 'stem/kernel', 3): col(8),
      (p + 'stem/bias', 0): col(8),
      (b + 'conv1/kernel', 2): col(8),
      (b + 'proj/kernel', 2): col(8),
    },
  )
  inner = group_with(graph, b + 'conv1/kernel', 3)
  assert_group(
    inner,
    {
      (b + 'conv1/kernel', 3): col(16),
      **_bn('block/', 'bn1', 16),
      (b + 'conv2/kernel', 2): col(16),
    },
  )
  residual = group_with(graph, b + 'conv2/kernel', 3)
  assert_group(
    residual,
    {
      (b + 'conv2/kernel', 3): col(16),
      **_bn('block/', 'bn2', 16),
      (b + 'proj/kernel', 3): col(16),
      **_bn('block/', 'proj_bn', 16),
      (p + 'head/kernel', 0): col(16),
    },
  )
  assert len(graph.prunable_groups) == 3
  # stem 2*(2*8*8*8)*27; conv1 2*(2*4*4*16)*(9*8); conv2 2*512*(9*16); proj 2*512*8; head 2*2*16*3
  assert graph.total_flops == 55296 + 73728 + 147456 + 8192 + 192
  assert stem.flops_per_channel == pytest.approx(55296 / 8 + 73728 / 8 + 8192 / 8)
  assert inner.flops_per_channel == pytest.approx(73728 / 16 + 147456 / 16)
  assert residual.flops_per_channel == pytest.approx(147456 / 16 + 8192 / 16 + 192 / 16)


def test_resnet_block_identity_shortcut_ties_stem_to_block_output():
  graph = trace('resnet_identity')
  p, b = 'params/', 'params/block/'
  assert_group(
    group_with(graph, b + 'conv1/kernel', 3),
    {(b + 'conv1/kernel', 3): col(8), **_bn('block/', 'bn1', 8), (b + 'conv2/kernel', 2): col(8)},
  )
  assert_group(
    group_with(graph, p + 'stem/kernel', 3),
    {
      (p + 'stem/kernel', 3): col(8),
      (p + 'stem/bias', 0): col(8),
      (b + 'conv1/kernel', 2): col(8),
      (b + 'conv2/kernel', 3): col(8),
      **_bn('block/', 'bn2', 8),
      (p + 'head/kernel', 0): col(8),
    },
  )
  assert len(graph.prunable_groups) == 2


def test_depthwise_separable():
  graph = trace('depthwise_separable')
  p = 'params/'
  mid = group_with(graph, p + 'expand/kernel', 3)
  assert_group(
    mid,
    {
      (p + 'expand/kernel', 3): col(12),
      (p + 'expand/bias', 0): col(12),
      **_bn('', 'bn1', 12),
      (p + 'depthwise/kernel', 3): col(12),
      (p + 'depthwise/bias', 0): col(12),
      **_bn('', 'bn2', 12),
      (p + 'project/kernel', 2): col(12),
    },
  )
  assert_group(
    group_with(graph, p + 'project/kernel', 3),
    {
      (p + 'project/kernel', 3): col(8),
      (p + 'project/bias', 0): col(8),
      (p + 'head/kernel', 0): col(8),
    },
  )
  # The depthwise kernel (3, 3, 1, 12) has a size-1 in-feature axis: never tracked.
  assert sorted(graph.leaf_axes[p + 'depthwise/kernel']) == [0, 1, 3]
  # expand 2*(2*6*6*12)*3; depthwise 2*864*9; project 2*(2*6*6*8)*12
  assert mid.flops_per_channel == pytest.approx(5184 / 12 + 15552 / 12 + 13824 / 12)


def test_grouped_conv_splits_channels_into_group_and_within_group_factors():
  graph = trace('grouped_conv')
  p = 'params/'
  halves = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
  strided = np.array([[0, 4], [1, 5], [2, 6], [3, 7]])
  # A whole conv group: its 4 input channels and its 4 output channels.
  assert_group(
    group_with(graph, p + 'reduce/kernel', 3, k=4),
    {
      (p + 'reduce/kernel', 3): halves,
      (p + 'reduce/bias', 0): halves,
      (p + 'grouped/kernel', 3): halves,
      (p + 'grouped/bias', 0): halves,
      (p + 'expand/kernel', 2): halves,
    },
  )
  # Input channel j of every group, with the kernel's in-feature j.
  assert_group(
    group_with(graph, p + 'reduce/kernel', 3, k=2),
    {
      (p + 'reduce/kernel', 3): strided,
      (p + 'reduce/bias', 0): strided,
      (p + 'grouped/kernel', 2): col(4),
    },
  )
  # Output channel m of every group.
  assert_group(
    group_with(graph, p + 'grouped/kernel', 3, k=2),
    {
      (p + 'grouped/kernel', 3): strided,
      (p + 'grouped/bias', 0): strided,
      (p + 'expand/kernel', 2): strided,
    },
  )
  assert_group(
    group_with(graph, p + 'expand/kernel', 3),
    {
      (p + 'expand/kernel', 3): col(6),
      (p + 'expand/bias', 0): col(6),
      (p + 'head/kernel', 0): col(6),
    },
  )
  assert len(graph.prunable_groups) == 4


def test_concat_members_own_offset_ranges():
  graph = trace('concat')
  p = 'params/'
  assert_group(
    group_with(graph, p + 'conv_a/kernel', 3),
    {
      (p + 'conv_a/kernel', 3): col(4),
      (p + 'conv_a/bias', 0): col(4),
      (p + 'conv_b/kernel', 2): col(4),
      (p + 'conv_c/kernel', 2): col(4),
    },
  )
  assert_group(
    group_with(graph, p + 'conv_b/kernel', 3),
    {
      (p + 'conv_b/kernel', 3): col(6),
      (p + 'conv_b/bias', 0): col(6),
      (p + 'conv_c/kernel', 2): 4 + col(6),
    },
  )


def test_glu_split_ties_value_and_gate_halves():
  graph = trace('glu_split')
  p = 'params/'
  pairs = np.stack([np.arange(8), 8 + np.arange(8)], axis=1)
  group = group_with(graph, p + 'fc_in/kernel', 1, k=2)
  assert_group(
    group,
    {
      (p + 'fc_in/kernel', 1): pairs,
      (p + 'fc_in/bias', 0): pairs,
      (p + 'fc_out/kernel', 0): col(8),
    },
  )
  # fc_in: 2*2*5*16 = 320 over 16 positions, 2 per channel; fc_out 2*2*8*4 = 128 over 8.
  assert group.flops_per_channel == pytest.approx(2 * 320 / 16 + 128 / 8)


def test_transformer_block():
  graph = trace('transformer_block')
  a, p = 'params/attn/', 'params/'
  assert_group(
    group_with(graph, a + 'query/kernel', 1),
    {(a + f'{n}/kernel', 1): col(2) for n in ('query', 'key', 'value')}
    | {(a + f'{n}/bias', 0): col(2) for n in ('query', 'key', 'value')}
    | {(a + 'out/kernel', 0): col(2)},
  )
  assert_group(
    group_with(graph, a + 'query/kernel', 2),
    {
      (a + 'query/kernel', 2): col(4),
      (a + 'key/kernel', 2): col(4),
      (a + 'query/bias', 1): col(4),
      (a + 'key/bias', 1): col(4),
    },
  )
  assert_group(
    group_with(graph, a + 'value/kernel', 2),
    {(a + 'value/kernel', 2): col(4), (a + 'value/bias', 1): col(4), (a + 'out/kernel', 1): col(4)},
  )
  assert_group(
    group_with(graph, p + 'mlp_in/kernel', 1),
    {
      (p + 'mlp_in/kernel', 1): col(12),
      (p + 'mlp_in/bias', 0): col(12),
      (p + 'mlp_out/kernel', 0): col(12),
    },
  )
  stream = group_with(graph, p + 'ln1/scale', 0)
  expected = {(p + f'{ln}/{w}', 0): col(6) for ln in ('ln1', 'ln2') for w in ('scale', 'bias')}
  expected |= {(a + f'{n}/kernel', 0): col(6) for n in ('query', 'key', 'value')}
  expected |= {
    (a + 'out/kernel', 2): col(6),
    (a + 'out/bias', 0): col(6),
    (p + 'mlp_in/kernel', 0): col(6),
    (p + 'mlp_out/kernel', 1): col(6),
    (p + 'mlp_out/bias', 0): col(6),
  }
  assert_group(stream, expected, prunable=False, reason='reaches model input 0 axis 2')
  assert len(graph.prunable_groups) == 4


def test_scan_over_layers_shares_channels_and_blocks_the_layer_axis():
  graph = trace('scanned_layers')
  s = 'params/layers/'
  hidden = group_with(graph, s + 'fc1/kernel', 2)
  assert_group(
    hidden,
    {(s + 'fc1/kernel', 2): col(8), (s + 'fc1/bias', 1): col(8), (s + 'fc2/kernel', 1): col(8)},
  )
  for leaf in ('fc1/kernel', 'fc1/bias', 'fc2/kernel', 'fc2/bias'):
    assert group_with(graph, s + leaf, 0).reason == 'scan iteration axis'
  assert group_with(graph, s + 'fc2/bias', 1).reason == 'reaches model input 0 axis 1'
  # 3 layers x (2*2*6*8 + 2*2*8*6); per hidden channel 3 x (192/8 + 192/8).
  assert graph.total_flops == 3 * 384
  assert hidden.flops_per_channel == pytest.approx(3 * 48)


def test_embedding_features_prunable_vocabulary_blocked():
  graph = trace('embedding')
  p = 'params/'
  assert_group(
    group_with(graph, p + 'embed/embedding', 1),
    {(p + 'embed/embedding', 1): col(8), (p + 'head/kernel', 0): col(8)},
  )
  assert_group(
    group_with(graph, p + 'embed/embedding', 0),
    {(p + 'embed/embedding', 0): col(10)},
    prunable=False,
    reason="blocked by primitive 'gather'",
  )
  assert graph.blocked_primitives == {'gather': 1}


@pytest.mark.parametrize('case', ['nnx_model', 'nnx_model_train'])
def test_nnx_model(case):
  graph = trace(case)
  assert_group(
    group_with(graph, 'fc1/kernel', 1),
    {
      ('fc1/kernel', 1): col(7),
      ('fc1/bias', 0): col(7),
      ('bn/scale', 0): col(7),
      ('bn/bias', 0): col(7),
      ('bn/mean', 0): col(7),
      ('bn/var', 0): col(7),
      ('fc2/kernel', 0): col(7),
    },
  )
  assert len(graph.prunable_groups) == 1


def test_custom_primitive_blocks_and_warns_until_a_rule_is_registered(monkeypatch):
  fn, params, args, _ = zoo.custom_primitive()
  with pytest.warns(UserWarning, match="'zoo_soft_shrink' has no channel rule"):
    graph = structured.trace(fn, params, *args)
  assert graph.prunable_groups == []
  assert_group(
    group_with(graph, 'w1', 1),
    {('w1', 1): col(8)},
    prunable=False,
    reason="blocked by primitive 'zoo_soft_shrink'",
  )
  # x @ w1 (2, 8) in and out of the primitive: 4 axes.
  assert graph.blocked_primitives == {'zoo_soft_shrink': 4}
  assert 'zoo_soft_shrink (4 axes)' in graph.summary()
  monkeypatch.setattr(primitives, 'TABLE', dict(primitives.TABLE))
  structured.register_rule('zoo_soft_shrink', structured.elementwise)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    graph = structured.trace(fn, params, *args)
  assert_group(group_with(graph, 'w1', 1), {('w1', 1): col(8), ('w2', 0): col(8)})


def test_control_flow_sub_jaxprs():
  graph = trace('control_flow')
  group = group_with(graph, 'w1', 1)
  assert_group(group, {('w1', 1): col(8), ('b1', 0): col(8), ('w2', 0): col(8)})
  assert group.flops_per_channel == pytest.approx(160 / 8 + 96 / 8)
  scopes = {scope for scope, _ in graph.var_axes}
  assert len(scopes) > 5  # jit, remat2, custom_jvp/vjp bodies, cond branches, while


@pytest.mark.parametrize('case', sorted(zoo.ZOO))
def test_every_tracked_axis_is_covered_exactly_by_its_parts(case):
  fn, variables, args, _ = zoo.ZOO[case]()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = structured.trace(fn, variables, *args)
  sizes = {g.id: g.size for g in graph.groups}
  for (_, var), axes in graph.var_axes.items():
    for axis, parts in axes.items():
      n = var.aval.shape[axis]
      owned = np.concatenate([p.indices.ravel() for p in parts])
      assert set(owned.tolist()) == set(range(n))
      for part in parts:
        assert part.indices.shape[0] == sizes[part.group_id]
        # within one part, a position belongs to one channel
        assert len(np.unique(part.indices)) == part.indices.size
