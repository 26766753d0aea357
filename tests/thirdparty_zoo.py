"""Models from libraries nobody on jaxprune wrote, as `fn(variables, *args)`: dm-haiku,
equinox and keras 3 here, transformers Flax in `thirdparty_zoo_hf`.

Each builder makes a model from its library's own config with random weights
(never a download) and returns a `Case`. Widths, depths and images are small
so the whole third-party suite stays fast on two CPU cores; the structure
(residuals, projections, grouped convs, BatchNorm, attention, GQA, RoPE) is
the library's own. The hand count of prunable channel groups of each case is
worked out next to its builder.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

# Keras picks its backend once, at its first import.
os.environ.setdefault('KERAS_BACKEND', 'jax')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxprune._names import leaf_name, named_leaves  # noqa: E402

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Case:
  """One third-party model, ready to trace.

  Attributes:
    library: the library that defines the model.
    fn: `fn(variables, *args)`, the model as a function of its variables.
    variables: the pytree of arrays (or `jax.ShapeDtypeStruct`s) to prune.
    inputs: `inputs(batch)` returns the example args at that batch size.
    prunable: the number of prunable channel groups, worked out by hand.
    unread: variables leaves the function never reads (they must not be pruned).
    symbolic_batch: the function itself traces at a symbolic batch size.
  """

  library: str
  fn: Callable[..., Any]
  variables: PyTree
  inputs: Callable[[int], tuple]
  prunable: int
  unread: tuple[str, ...] = ()
  symbolic_batch: bool = True


def normal(*shape: int, seed: int = 1) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def token_ids(batch: int, length: int, vocab: int, seed: int = 2) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, (batch, length)), jnp.int32)


def random_like(tree: PyTree, out_first: bool = False, seed: int = 0) -> PyTree:
  """Random values for a pytree of shapes, drawn in numpy (no XLA compile per leaf).

  Kernels get N(0, 1/fan_in) so activations keep their scale through deep
  models; biases and means small values; variances U(0.5, 1.5); norm scales and
  other vectors 1 + N(0, 0.01); integer and bool leaves zeros.

  Args:
    tree: a pytree of arrays or `jax.ShapeDtypeStruct`s.
    out_first: kernels are laid out `(out, in, ...)` (equinox), not `(..., in, out)`.
    seed: numpy seed.

  Returns:
    The same pytree of `jax.Array`s.
  """
  rng = np.random.default_rng(seed)

  def value(path, leaf):
    name, shape, dtype = leaf_name(path).lower(), tuple(leaf.shape), np.dtype(leaf.dtype)
    last = name.rsplit('/', 1)[-1]
    if not np.issubdtype(dtype, np.floating):
      return jnp.zeros(shape, dtype)
    if any(k in last for k in ('bias', 'offset', 'beta')) or 'mean' in name:
      data = 0.1 * rng.normal(size=shape)
    elif 'var' in name:
      data = rng.uniform(0.5, 1.5, shape)
    elif len(shape) <= 1:
      data = 1.0 + 0.1 * rng.normal(size=shape)
    else:
      fan_in = np.prod(shape[1:]) if out_first else np.prod(shape[:-1])
      data = rng.normal(size=shape) / np.sqrt(fan_in)
    return jnp.asarray(data.astype(dtype))

  return jax.tree_util.tree_map_with_path(value, tree)


# -- dm-haiku -----------------------------------------------------------------


def _haiku(net: Callable[[], Any], image: int, train: bool, values: bool = True) -> tuple:
  """A haiku `transform_with_state` model as `fn({'params', 'state'}, x)`.

  In eval mode `fn` returns the logits; in train mode it returns
  `(logits, {'state': new_state})`, so the new state is matched to the
  variables it updates. `values=False` keeps the variables as shapes.
  """
  import haiku as hk

  transformed = hk.transform_with_state(lambda x, is_training: net()(x, is_training))
  # haiku creates the BatchNorm moving averages on their first update (train mode).
  params, state = jax.eval_shape(
    functools.partial(transformed.init, is_training=True),
    jax.random.key(0),
    jax.ShapeDtypeStruct((1, image, image, 3), jnp.float32),
  )
  variables = {'params': params, 'state': state}

  def fn(variables, x):
    out, new_state = transformed.apply(
      variables['params'], variables['state'], None, x, is_training=train
    )
    return (out, {'state': new_state}) if train else out

  return fn, random_like(variables) if values else variables


def _haiku_unread(variables: PyTree) -> tuple[str, ...]:
  """haiku's BatchNorm EMA `hidden` and `counter`: eval mode reads only `average`."""
  return tuple(
    name for name, _ in named_leaves(variables) if name.endswith(('/hidden', '/counter'))
  )


def haiku_resnet18(train: bool = False, width: int = 16, image: int | None = None) -> Case:
  """`hk.nets.ResNet` with ResNet-18's config (2-2-2-2 basic blocks, no projection
  in stage 1) at stage widths `width` x (1, 2, 4, 8) (ResNet-18: 64), on 32x32
  images (64x64 in train mode).

  Prunable groups: inside each of the 8 blocks, its first conv's output (8);
  the residual stream of stage 1, tied to the stem through the identity
  shortcut (1); the streams of stages 2-4, each opened by a projection (3).
  12 in all, in eval and train mode. In eval mode each BatchNorm's EMA
  `hidden` and `counter` are never read.
  """
  import haiku as hk

  config = dict(
    hk.nets.ResNet.CONFIGS[18], channels_per_group=tuple(width * m for m in (1, 2, 4, 8))
  )
  net = lambda: hk.nets.ResNet(
    **config, num_classes=10, initial_conv_config={'output_channels': width}
  )
  # Train mode normalises with batch statistics: 64x64 images leave stage 4 with
  # 2x2 positions per image, not 1x1 (statistics of two numbers amplify rounding).
  image = image or (64 if train else 32)
  fn, variables = _haiku(net, image, train)
  return Case(
    'dm-haiku',
    fn,
    variables,
    lambda b: (normal(b, image, image, 3),),
    12,
    () if train else _haiku_unread(variables),
  )


def haiku_resnet50_full() -> Case:
  """`hk.nets.ResNet50` at full size, 224x224 (shapes only, for the count).

  37 prunable groups, Torch-Pruning's count on torchvision's ResNet-50: the
  stem (1), two inside each of the 16 bottlenecks (32), one residual stream per
  stage (4; every stage starts with a projection in ResNet-50).
  """
  import haiku as hk

  fn, variables = _haiku(lambda: hk.nets.ResNet50(1000), 224, False, values=False)
  return Case(
    'dm-haiku',
    fn,
    variables,
    lambda b: (jax.ShapeDtypeStruct((b, 224, 224, 3), jnp.float32),),
    37,
    _haiku_unread(variables),
  )


def haiku_mobilenet_v1(
  channels: tuple[int, ...] = (16, 32, 32, 64),
  strides: tuple[int, ...] = (1, 2, 1, 2),
  image: int = 32,
) -> Case:
  """`hk.nets.MobileNetV1` with four blocks (16-32-32-64 channels), 32x32 images.

  A depthwise conv ties its input and output channels, so each pointwise
  conv's output is one group with the next block's depthwise conv (the last
  one with the logits' input): one per block, plus the stem's 32 channels
  with the first depthwise conv. 5 for four blocks.
  """
  import haiku as hk

  net = lambda: hk.nets.MobileNetV1(strides=strides, channels=channels, num_classes=10)
  fn, variables = _haiku(net, image, False)
  return Case(
    'dm-haiku',
    fn,
    variables,
    lambda b: (normal(b, image, image, 3),),
    len(channels) + 1,
    _haiku_unread(variables),
  )


# -- equinox ------------------------------------------------------------------


def equinox_mlp() -> Case:
  """`eqx.nn.MLP` 16 -> 32 -> 32 -> 32 -> 4 (depth 3), vmapped over the batch.

  Each of the 3 hidden widths is one group: 3.
  """
  import equinox as eqx

  model = eqx.nn.MLP(16, 4, 32, 3, key=jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_array)
  fn = lambda params, x: jax.vmap(eqx.combine(params, static))(x)
  return Case('equinox', fn, random_like(params, out_first=True), lambda b: (normal(b, 16),), 3)


def equinox_cnn(train: bool = False, widths: tuple[int, ...] = (16, 32), image: int = 16) -> Case:
  """A CNN of `eqx.nn.Conv2d` + `eqx.nn.BatchNorm` (3 -> 16 -> 32 channels, 16x16
  images, NCHW as equinox has it), mean-pooled into an `eqx.nn.Linear`.

  Each conv's output is one group with its BatchNorm and the next layer's
  input: one per conv, 2. The BatchNorm runs in eval mode (running statistics) or train
  mode (batch statistics; `fn` then also returns the new state). In train mode
  `lax.pmean` over the vmapped batch does not trace at a symbolic batch size.
  """
  import equinox as eqx

  class CNN(eqx.Module):
    convs: tuple
    norms: tuple
    head: eqx.nn.Linear

    def __init__(self, key):
      keys = jax.random.split(key, len(widths) + 1)
      sizes = (3, *widths)
      self.convs = tuple(
        eqx.nn.Conv2d(n, m, 3, padding=1, key=k)
        for n, m, k in zip(sizes, widths, keys, strict=False)
      )
      self.norms = tuple(
        eqx.nn.BatchNorm(c, 'batch', mode='batch', inference=not train) for c in widths
      )
      self.head = eqx.nn.Linear(widths[-1], 10, key=keys[-1])

    def __call__(self, x, state):
      for conv, norm in zip(self.convs, self.norms, strict=True):
        x, state = norm(conv(x), state)
        x = jax.nn.relu(x)
      return self.head(jnp.mean(x, axis=(1, 2))), state

  model, state = eqx.nn.make_with_state(CNN)(jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_array)
  variables = random_like({'params': params, 'state': state}, out_first=True)

  def fn(variables, x):
    model = eqx.combine(variables['params'], static)
    out, new_state = jax.vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name='batch')(
      x, variables['state']
    )
    return (out, {'state': new_state}) if train else out

  return Case(
    'equinox',
    fn,
    variables,
    lambda b: (normal(b, 3, image, image),),
    len(widths),
    symbolic_batch=not train,
  )


# -- keras 3 on JAX -----------------------------------------------------------


def _keras(build: Callable[[], Any], image: int, prunable: int, values: bool = True) -> Case:
  """A keras model as `fn(variables, x)`, `variables` keyed by each variable's path
  (`block_1_expand/kernel`), so the groups name the keras layers. `fn` calls
  `model.stateless_call` in inference mode and returns the predictions.
  """
  import keras

  if keras.backend.backend() != 'jax':
    raise RuntimeError(
      f'keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax '
      'before keras is first imported.'
    )
  model = build()
  variables = {v.path: jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.variables}
  if values:
    variables = random_like(variables)

  def fn(variables, x):
    values = lambda vs: [variables[v.path] for v in vs]
    out, _ = model.stateless_call(
      values(model.trainable_variables), values(model.non_trainable_variables), x, training=False
    )
    return out

  inputs = (
    (lambda b: (normal(b, image, image, 3),))
    if values
    else (lambda b: (jax.ShapeDtypeStruct((b, image, image, 3), jnp.float32),))
  )
  return Case('keras', fn, variables, inputs, prunable)


def keras_mobilenet_v2(alpha: float = 0.35, image: int = 32) -> Case:
  """`keras.applications.MobileNetV2(alpha=0.35)` on 32x32 images, 10 classes.

  25 prunable groups, as Torch-Pruning counts torchvision's MobileNetV2 (the
  width multiplier changes no tie): the stem with the first block's depthwise
  conv (1); each of the 16 expanding blocks' expanded channels, tied through
  its depthwise conv (16); the 7 bottleneck streams (16, 24, 32, 64, 96, 160,
  320 channels at alpha 1), each tied across its stage by the residual adds
  (7); the last 1x1 conv before pooling (1).
  """
  import keras

  build = lambda: keras.applications.MobileNetV2(
    input_shape=(image, image, 3), alpha=alpha, weights=None, classes=10
  )
  return _keras(build, image, 25)


def keras_densenet121_full() -> Case:
  """`keras.applications.DenseNet121` at 224x224 (shapes only, for the count).

  120, Torch-Pruning's count on torchvision's DenseNet-121: each of the 58
  dense layers has its 1x1 bottleneck (128 channels) and its 32 new feature
  maps, which the concatenations carry to every later layer of the block and
  the transition after it (116); the 3 transitions' 1x1 convs (3); the stem
  (1).
  """
  import keras

  build = lambda: keras.applications.DenseNet121(weights=None)
  return _keras(build, 224, 120, values=False)


def keras_resnet50_full() -> Case:
  """`keras.applications.ResNet50` at 224x224 (shapes only, for the count).

  37, as for every ResNet-50 v1: the stem (1), two inside each of the 16
  bottlenecks (32), one residual stream per stage (4).
  """
  import keras

  build = lambda: keras.applications.ResNet50(weights=None)
  return _keras(build, 224, 37, values=False)
