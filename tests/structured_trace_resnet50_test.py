"""ResNet-50 (tests/resnet50.py, also timed by benchmarks/trace.py): groups and FLOPs against
published counts."""

import jax
import jax.numpy as jnp
import pytest
from resnet50 import ResNet50

import jaxprune.structured as structured


@pytest.mark.slow
def test_resnet50_groups_and_flops():
  model = ResNet50()
  x = jnp.zeros((1, 224, 224, 3))
  variables = jax.eval_shape(model.init, jax.random.key(0), x)  # shapes are enough
  graph = structured.trace(model.apply, variables, x)
  # torchvision's published ResNet-50 cost: 4.09 GMACs at 224x224.
  assert graph.total_flops / 2 == pytest.approx(4.09e9, rel=2e-3)
  # Prunable: the stem's 64 outputs; two inner groups per bottleneck (3, 4, 6, 3
  # blocks of width 64, 128, 256, 512); one residual stream per stage (256,
  # 512, 1024, 2048), each tied through its adds and projection.
  expected = [64] + [64] * 6 + [128] * 8 + [256] * 12 + [512] * 6 + [256, 512, 1024, 2048]
  assert sorted(g.size for g in graph.prunable_groups) == sorted(expected)
  stream = graph.groups[graph.leaf_axes['params/Dense_0/kernel'][0][0].group_id]
  conv_axes = sorted(
    m.axis for m in stream.members if m.leaf.endswith('kernel') and 'Conv' in m.leaf
  )
  # Last stage: the last conv of its 3 blocks and the projection write the
  # stream (out axis 3); the first conv of blocks 2 and 3 read it (in axis 2).
  assert conv_axes == [2, 2, 3, 3, 3, 3]
