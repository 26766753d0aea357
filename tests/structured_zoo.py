"""Small models for the structured-pruning tests.

Each case is a function returning `(fn, variables, example_args, description)`
where `fn(variables, *example_args)` runs the model. Shapes are tiny so the
expected channel groups can be worked out by hand in the tests.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from structured_zoo_primitives import CASES as PRIMITIVE_CASES

from jaxprune._names import leaf_name


def _fill(tree):
  """Random values for a tree of shapes, made in numpy (no XLA compile per op)."""
  rng = np.random.default_rng(0)

  def value(path, leaf):
    kind = leaf_name(path).rsplit('/', 1)[-1]
    shape, dtype = leaf.shape, leaf.dtype
    if kind == 'var':
      data = rng.uniform(0.5, 1.5, shape)
    elif kind == 'mean':
      data = 0.1 * rng.normal(size=shape)
    elif kind == 'scale':
      data = 1.0 + 0.1 * rng.normal(size=shape)
    else:
      data = 0.3 * rng.normal(size=shape)
    return jnp.asarray(data.astype(dtype))

  return jax.tree_util.tree_map_with_path(value, tree)


def _init(model: nn.Module, *args, **kwargs):
  return _fill(jax.eval_shape(functools.partial(model.init, **kwargs), jax.random.key(0), *args))


def _x(*shape: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(1).normal(size=shape).astype(np.float32))


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(16, name='fc1')(x))
    x = nn.relu(nn.Dense(8, name='fc2')(x))
    return nn.Dense(4, name='fc3')(x)


def mlp():
  x = _x(2, 10)
  model = MLP()
  return model.apply, _init(model, x), (x,), 'MLP 10-16-8-4'


class CNN(nn.Module):
  train: bool = False

  @nn.compact
  def __call__(self, x):
    norm = lambda name: nn.BatchNorm(use_running_average=not self.train, name=name)
    x = nn.relu(norm('bn1')(nn.Conv(8, (3, 3), name='conv1')(x)))
    x = nn.relu(norm('bn2')(nn.Conv(16, (3, 3), strides=2, name='conv2')(x)))
    return nn.Dense(5, name='head')(jnp.mean(x, axis=(1, 2)))


def cnn_bn_eval():
  x = _x(2, 8, 8, 3)
  model = CNN()
  return model.apply, _init(model, x), (x,), 'conv-BN-relu x2, mean pool, dense (eval)'


def cnn_bn_train():
  x = _x(2, 8, 8, 3)
  model = CNN(train=True)
  variables = _init(CNN(), x)
  fn = functools.partial(model.apply, mutable=['batch_stats'])
  return fn, variables, (x,), 'conv-BN-relu x2 in train mode, batch stats returned'


class BasicBlock(nn.Module):
  """ResNet basic block (He et al. 2016); projection shortcut when shapes change."""

  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x):
    norm = lambda name: nn.BatchNorm(use_running_average=True, name=name)
    y = nn.Conv(self.features, (3, 3), strides=self.strides, use_bias=False, name='conv1')(x)
    y = nn.relu(norm('bn1')(y))
    y = norm('bn2')(nn.Conv(self.features, (3, 3), use_bias=False, name='conv2')(y))
    if x.shape[-1] != self.features or self.strides != 1:
      x = nn.Conv(self.features, (1, 1), strides=self.strides, use_bias=False, name='proj')(x)
      x = norm('proj_bn')(x)
    return nn.relu(x + y)


class ResNetTiny(nn.Module):
  features: int
  strides: int

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (3, 3), name='stem')(x))
    x = BasicBlock(self.features, self.strides, name='block')(x)
    return nn.Dense(3, name='head')(jnp.mean(x, axis=(1, 2)))


def resnet_projection():
  x = _x(2, 8, 8, 3)
  model = ResNetTiny(features=16, strides=2)
  return model.apply, _init(model, x), (x,), 'stem + ResNet basic block, projection shortcut'


def resnet_identity():
  x = _x(2, 8, 8, 3)
  model = ResNetTiny(features=8, strides=1)
  return model.apply, _init(model, x), (x,), 'stem + ResNet basic block, identity shortcut'


class DepthwiseSeparable(nn.Module):
  """MobileNet-v2 style: expand 1x1, depthwise 3x3, project 1x1."""

  @nn.compact
  def __call__(self, x):
    norm = lambda name: nn.BatchNorm(use_running_average=True, name=name)
    x = nn.relu(norm('bn1')(nn.Conv(12, (1, 1), name='expand')(x)))
    x = nn.Conv(12, (3, 3), feature_group_count=12, name='depthwise')(x)
    x = nn.relu(norm('bn2')(x))
    x = nn.Conv(8, (1, 1), name='project')(x)
    return nn.Dense(4, name='head')(jnp.mean(x, axis=(1, 2)))


def depthwise_separable():
  x = _x(2, 6, 6, 3)
  model = DepthwiseSeparable()
  return model.apply, _init(model, x), (x,), 'MobileNet depthwise-separable block'


class GroupedBlock(nn.Module):
  """ResNeXt style: 1x1 to 8 channels, 3x3 conv in 2 groups of 4, 1x1 to 6."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (1, 1), name='reduce')(x))
    x = nn.relu(nn.Conv(8, (3, 3), feature_group_count=2, name='grouped')(x))
    x = nn.Conv(6, (1, 1), name='expand')(x)
    return nn.Dense(3, name='head')(jnp.mean(x, axis=(1, 2)))


def grouped_conv():
  x = _x(2, 6, 6, 4)
  model = GroupedBlock()
  return model.apply, _init(model, x), (x,), 'ResNeXt grouped conv (2 groups)'


class DenseConcat(nn.Module):
  """DenseNet style: the second conv sees the first's output; both are concatenated."""

  @nn.compact
  def __call__(self, x):
    a = nn.relu(nn.Conv(4, (3, 3), name='conv_a')(x))
    b = nn.relu(nn.Conv(6, (3, 3), name='conv_b')(a))
    x = nn.Conv(5, (1, 1), name='conv_c')(jnp.concatenate([a, b], axis=-1))
    return nn.Dense(3, name='head')(jnp.mean(x, axis=(1, 2)))


def concat():
  x = _x(2, 6, 6, 3)
  model = DenseConcat()
  return model.apply, _init(model, x), (x,), 'DenseNet-style concat of two convs'


class GLU(nn.Module):
  """Gated linear unit (Dauphin et al. 2017): split a 16-wide Dense into value and gate."""

  @nn.compact
  def __call__(self, x):
    value, gate = jnp.split(nn.Dense(16, name='fc_in')(x), 2, axis=-1)
    return nn.Dense(4, name='fc_out')(value * nn.sigmoid(gate))


def glu_split():
  x = _x(2, 5)
  model = GLU()
  return model.apply, _init(model, x), (x,), 'GLU: channel split of one Dense'


class TransformerBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8, name='attn')(
      nn.LayerNorm(name='ln1')(x)
    )
    x = x + y
    y = nn.Dense(12, name='mlp_in')(nn.LayerNorm(name='ln2')(x))
    return x + nn.Dense(6, name='mlp_out')(nn.gelu(y))


def transformer_block():
  x = _x(2, 5, 6)
  model = TransformerBlock()
  return model.apply, _init(model, x), (x,), 'pre-LN transformer block, 2 heads x 4, MLP 12'


class ScanLayer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x + nn.Dense(6, name='fc2')(nn.relu(nn.Dense(8, name='fc1')(x))), None


class ScannedStack(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(ScanLayer, variable_axes={'params': 0}, split_rngs={'params': True}, length=3)(
      name='layers'
    )
    x, _ = stack(x, None)
    return x


def scanned_layers():
  x = _x(2, 6)
  model = ScannedStack()
  return model.apply, _init(model, x), (x,), 'nn.scan over 3 residual MLP layers'


class EmbedModel(nn.Module):
  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(num_embeddings=10, features=8, name='embed')(ids)
    return nn.Dense(4, name='head')(nn.relu(x))


def embedding():
  ids = jnp.array([[1, 2, 3], [4, 5, 9]])
  model = EmbedModel()
  return model.apply, _init(model, ids), (ids,), 'embedding table, then Dense'


class NNXNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(5, 7, rngs=rngs)
    self.bn = nnx.BatchNorm(7, rngs=rngs)
    self.fc2 = nnx.Linear(7, 3, rngs=rngs)

  def __call__(self, x):
    return self.fc2(nnx.relu(self.bn(self.fc1(x))))


def nnx_model():
  model = nnx.eval_shape(lambda: NNXNet(nnx.Rngs(0)))
  model.eval()
  graphdef, state = nnx.split(model)
  state = _fill(state)
  fn = lambda state, x: nnx.merge(graphdef, state)(x)
  return fn, state, (_x(2, 5),), 'Flax NNX Linear-BatchNorm-relu-Linear (split/merge)'


def nnx_model_train():
  model = nnx.eval_shape(lambda: NNXNet(nnx.Rngs(0)))
  model.train()
  graphdef, state = nnx.split(model)

  def fn(state, x):
    model = nnx.merge(graphdef, state)
    return model(x), nnx.state(model)

  return fn, _fill(state), (_x(2, 5),), 'Flax NNX in train mode, returning its new state'


def _make_custom_primitive() -> jax.extend.core.Primitive:
  prim = jax.extend.core.Primitive('zoo_soft_shrink')
  prim.def_impl(lambda x: jnp.sign(x) * jnp.maximum(jnp.abs(x) - 0.5, 0.0))
  prim.def_abstract_eval(lambda aval: jax.core.ShapedArray(aval.shape, aval.dtype))
  return prim


SOFT_SHRINK = _make_custom_primitive()


def custom_primitive():
  """A Dense-custom primitive-Dense MLP: the primitive has no rule."""
  x = _x(2, 5)
  params = {'w1': np.ones((5, 8), np.float32), 'w2': np.ones((8, 3), np.float32)}
  fn = lambda p, x: SOFT_SHRINK.bind(x @ p['w1']) @ p['w2']
  return fn, params, (x,), 'plain function with a primitive that has no channel rule'


def control_flow():
  """A plain params function through jit, checkpoint, custom_vjp, cond and while."""
  params = {
    'w1': np.ones((5, 8), np.float32),
    'b1': np.zeros((8,), np.float32),
    'w2': np.ones((8, 3), np.float32),
  }

  @jax.custom_vjp
  def scale(h):
    return 2.0 * h

  scale.defvjp(lambda h: (scale(h), None), lambda _, g: (2.0 * g,))

  def fn(p, x):
    h = jax.jit(lambda x, w, b: x @ w + b)(x, p['w1'], p['b1'])
    h = jax.checkpoint(lambda h: jnp.tanh(scale(h)))(h)
    h = jax.lax.cond(x[0, 0] > 0, lambda h: h * 2.0, jax.nn.relu, h)
    h = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, h))[1]
    return h @ p['w2']

  return fn, params, (_x(2, 5),), 'jit, checkpoint, custom_vjp, cond and while_loop'


ZOO = {
  f.__name__: f
  for f in (
    mlp,
    cnn_bn_eval,
    cnn_bn_train,
    resnet_projection,
    resnet_identity,
    depthwise_separable,
    grouped_conv,
    concat,
    glu_split,
    transformer_block,
    scanned_layers,
    embedding,
    nnx_model,
    nnx_model_train,
    custom_primitive,
    control_flow,
  )
} | PRIMITIVE_CASES
