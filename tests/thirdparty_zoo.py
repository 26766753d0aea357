"""Models from libraries nobody on jaxprune wrote, as `fn(variables, *args)`.

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
import warnings
from collections.abc import Callable
from typing import Any

# Keras picks its backend once, at its first import.
os.environ.setdefault('KERAS_BACKEND', 'jax')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

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
  """
  library: str
  fn: Callable[..., Any]
  variables: PyTree
  inputs: Callable[[int], tuple]
  prunable: int
  unread: tuple[str, ...] = ()


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
  from jaxprune.names import leaf_name
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
  params, state = jax.eval_shape(functools.partial(transformed.init, is_training=True),
                                 jax.random.key(0), jax.ShapeDtypeStruct((1, image, image, 3),
                                                                         jnp.float32))
  variables = {'params': params, 'state': state}

  def fn(variables, x):
    out, new_state = transformed.apply(variables['params'], variables['state'], None, x,
                                       is_training=train)
    return (out, {'state': new_state}) if train else out

  return fn, random_like(variables) if values else variables


def _haiku_unread(variables: PyTree) -> tuple[str, ...]:
  """haiku's BatchNorm EMA `hidden` and `counter`: eval mode reads only `average`."""
  from jaxprune.names import named_leaves
  return tuple(name for name, _ in named_leaves(variables)
               if name.endswith(('/hidden', '/counter')))


def haiku_resnet18(train: bool = False) -> Case:
  """`hk.nets.ResNet` with ResNet-18's config (2-2-2-2 basic blocks, no projection
  in stage 1) at 1/4 width, 32x32 images.

  Prunable groups: inside each of the 8 blocks, its first conv's output (8);
  the residual stream of stage 1, tied to the stem through the identity
  shortcut (1); the streams of stages 2-4, each opened by a projection (3).
  12 in all, in eval and train mode. In eval mode each BatchNorm's EMA
  `hidden` and `counter` are never read.
  """
  import haiku as hk

  config = dict(hk.nets.ResNet.CONFIGS[18], channels_per_group=(16, 32, 64, 128))
  net = lambda: hk.nets.ResNet(**config, num_classes=10,
                               initial_conv_config={'output_channels': 16})
  # Train mode normalises with batch statistics: 64x64 images leave stage 4 with
  # 2x2 positions per image, not 1x1 (statistics of two numbers amplify rounding).
  image = 64 if train else 32
  fn, variables = _haiku(net, image, train)
  return Case('dm-haiku', fn, variables, lambda b: (normal(b, image, image, 3),), 12,
              () if train else _haiku_unread(variables))


def haiku_resnet50_full() -> Case:
  """`hk.nets.ResNet50` at full size, 224x224 (shapes only, for the count).

  37 prunable groups, Torch-Pruning's count on torchvision's ResNet-50: the
  stem (1), two inside each of the 16 bottlenecks (32), one residual stream per
  stage (4; every stage starts with a projection in ResNet-50).
  """
  import haiku as hk

  fn, variables = _haiku(lambda: hk.nets.ResNet50(1000), 224, False, values=False)
  return Case('dm-haiku', fn, variables,
              lambda b: (jax.ShapeDtypeStruct((b, 224, 224, 3), jnp.float32),), 37,
              _haiku_unread(variables))


def haiku_mobilenet_v1() -> Case:
  """`hk.nets.MobileNetV1` with four blocks (16-32-32-64 channels), 32x32 images.

  A depthwise conv ties its input and output channels, so each pointwise
  conv's output is one group with the next block's depthwise conv (the last
  one with the logits' input): 4 groups, plus the stem's 32 channels with the
  first depthwise conv: 5.
  """
  import haiku as hk

  net = lambda: hk.nets.MobileNetV1(strides=(1, 2, 1, 2), channels=(16, 32, 32, 64),
                                    num_classes=10)
  fn, variables = _haiku(net, 32, False)
  return Case('dm-haiku', fn, variables, lambda b: (normal(b, 32, 32, 3),), 5,
              _haiku_unread(variables))


# -- equinox ------------------------------------------------------------------


def equinox_mlp() -> Case:
  """`eqx.nn.MLP` 16 -> 32 -> 32 -> 32 -> 4 (depth 3), vmapped over the batch.

  Each of the 3 hidden widths is one group: 3.
  """
  import equinox as eqx

  model = eqx.nn.MLP(16, 4, 32, 3, key=jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_array)
  fn = lambda params, x: jax.vmap(eqx.combine(params, static))(x)
  return Case('equinox', fn, random_like(params, out_first=True),
              lambda b: (normal(b, 16),), 3)


def equinox_cnn(train: bool = False) -> Case:
  """A CNN of `eqx.nn.Conv2d` + `eqx.nn.BatchNorm` (3 -> 16 -> 32 channels, 16x16
  images, NCHW as equinox has it), mean-pooled into an `eqx.nn.Linear`.

  Each conv's output is one group with its BatchNorm and the next layer's
  input: 2. The BatchNorm runs in eval mode (running statistics) or train
  mode (batch statistics; `fn` then also returns the new state).
  """
  import equinox as eqx

  class CNN(eqx.Module):
    convs: tuple
    norms: tuple
    head: eqx.nn.Linear

    def __init__(self, key):
      keys = jax.random.split(key, 3)
      self.convs = (eqx.nn.Conv2d(3, 16, 3, padding=1, key=keys[0]),
                    eqx.nn.Conv2d(16, 32, 3, padding=1, key=keys[1]))
      self.norms = tuple(eqx.nn.BatchNorm(c, 'batch', mode='batch', inference=not train)
                         for c in (16, 32))
      self.head = eqx.nn.Linear(32, 10, key=keys[2])

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
    out, new_state = jax.vmap(model, in_axes=(0, None), out_axes=(0, None),
                              axis_name='batch')(x, variables['state'])
    return (out, {'state': new_state}) if train else out

  return Case('equinox', fn, variables, lambda b: (normal(b, 3, 16, 16),), 2)


# -- Hugging Face transformers (Flax) -----------------------------------------


def _hf(model_class: Any, config: Any) -> tuple[Any, PyTree]:
  """A transformers Flax model with random params drawn from its own param shapes."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # transformers 4.x: "Flax classes are deprecated"
    model = model_class(config, _do_init=False)
  params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), model.input_shape))
  return model, random_like(params)


def _hf_image(model_class: Any, config: Any, prunable: int) -> Case:
  """An HF Flax image classifier as `fn(params, pixel_values)`, NCHW like HF."""
  model, params = _hf(model_class, config)
  fn = lambda params, pixels: model(pixels, params=params, train=False).logits
  size = config.image_size
  return Case('transformers', fn, params, lambda b: (normal(b, 3, size, size),), prunable)


def hf_resnet() -> Case:
  """`FlaxResNetForImageClassification`, bottleneck layers, 16-stem, 32-64-128-256
  stage widths with 1-1-2-1 layers, 32x32 images.

  As for any bottleneck ResNet: the stem (1), two inside each bottleneck (5
  layers: 10), one residual stream per stage (every first layer projects: 4).
  15. The full ResNet-50 config gives 1 + 2 * 16 + 4 = 37.
  """
  from transformers import FlaxResNetForImageClassification, ResNetConfig

  config = ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                        layer_type='bottleneck', num_labels=10, image_size=32)
  return _hf_image(FlaxResNetForImageClassification, config, 15)


def hf_regnet() -> Case:
  """`FlaxRegNetForImageClassification`, RegNetY layers (1x1 conv, grouped 3x3 conv,
  squeeze-excitation, 1x1 conv), 16-stem, 16-32 stage widths with 1-2 layers,
  conv groups 8 wide, 32x32 images.

  The stem (1) and the two residual streams (every stage's first layer
  projects: 2). Inside each of the 3 layers, the grouped conv (C = G conv
  groups x 8) gives three groups: whole conv groups (input and output), input
  channel j of every conv group, output channel j of every conv group; and
  the squeeze-excitation's reduced channels are a fourth: 12. 15 in all.
  """
  from transformers import FlaxRegNetForImageClassification, RegNetConfig

  config = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 2],
                        groups_width=8, layer_type='y', num_labels=10)
  config.image_size = 32
  return _hf_image(FlaxRegNetForImageClassification, config, 15)


# A transformer layer has four prunable groups: the attention heads (query,
# key, value and output together), the query/key head_dim, the value/output
# head_dim and the MLP's hidden units. The residual stream is reduced over by
# LayerNorm, so it is not prunable.
_PER_LAYER = 4


def hf_vit() -> Case:
  """`FlaxViTForImageClassification`: 2 layers, hidden 32, 4 heads, MLP 64, 8x8
  patches of 32x32 images. 2 layers x 4 = 8 groups."""
  from transformers import FlaxViTForImageClassification, ViTConfig

  config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, num_labels=10)
  return _hf_image(FlaxViTForImageClassification, config, 2 * _PER_LAYER)


def hf_beit() -> Case:
  """`FlaxBeitForImageClassification` with a relative position bias per layer (a
  table of (distances, heads) gathered per query/key pair: its heads axis is
  the layer's heads), layer scale, mean pooling: 2 layers x 4 = 8 groups."""
  from transformers import BeitConfig, FlaxBeitForImageClassification

  config = BeitConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=64, num_labels=10,
                      use_relative_position_bias=True)
  return _hf_image(FlaxBeitForImageClassification, config, 2 * _PER_LAYER)


def hf_dinov2() -> Case:
  """`FlaxDinov2ForImageClassification`: 2 layers, hidden 32, 4 heads, MLP ratio 2,
  position embeddings interpolated to the image, layer scale: 2 x 4 = 8
  groups. Its `mask_token` is read only with a patch mask, never here."""
  from transformers import Dinov2Config, FlaxDinov2ForImageClassification

  config = Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, mlp_ratio=2, num_labels=10)
  case = _hf_image(FlaxDinov2ForImageClassification, config, 2 * _PER_LAYER)
  return dataclasses.replace(case, unread=('dinov2/embeddings/mask_token',))


def hf_clip() -> Case:
  """`FlaxCLIPModel`, image-text logits: a 2-layer text tower (hidden 32, 4 heads)
  and a 2-layer vision tower (hidden 32, 4 heads, 8x8 patches of 32x32 images),
  projections to 16.

  4 layers x 4 = 16 groups. The projected embeddings are L2-normalised
  (reduced over), so the projection width is not prunable.
  """
  from transformers import CLIPConfig, FlaxCLIPModel

  text = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=16)
  vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4)
  config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
  model, params = _hf(FlaxCLIPModel, config)
  fn = lambda params, ids, pixels: model(ids, pixels, params=params, train=False).logits_per_image
  inputs = lambda b: (token_ids(b, 8, 100), normal(b, 3, 32, 32))
  return Case('transformers', fn, params, inputs, 4 * _PER_LAYER)


def _hf_text(model_class: Any, config: Any, prunable: int) -> Case:
  """An HF Flax text model as `fn(params, input_ids)` through `model.__call__`,
  which makes the attention mask, positions (and BERT's head mask) itself."""
  model, params = _hf(model_class, config)
  fn = lambda params, ids: model(ids, params=params, train=False).logits
  return Case('transformers', fn, params, lambda b: (token_ids(b, 8, config.vocab_size),),
              prunable)


def hf_bert() -> Case:
  """`FlaxBertForSequenceClassification`: 2 layers, hidden 32, 4 heads, MLP 64.

  2 x 4 groups, plus the pooler's units (a tanh Dense between the [CLS]
  token and the classifier): 9. `model.__call__` passes a head mask
  `ones((layers, heads))`; each layer multiplies by its own row, so each
  layer keeps its own heads group.
  """
  from transformers import BertConfig, FlaxBertForSequenceClassification

  config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=16, num_labels=3)
  return _hf_text(FlaxBertForSequenceClassification, config, 2 * _PER_LAYER + 1)


def hf_gpt2() -> Case:
  """`FlaxGPT2LMHeadModel`: 2 layers, 32 wide, 4 heads, MLP 128 (4 x 32). One
  fused query-key-value projection split in three, causal mask, LM head tied
  to the token embedding: 2 x 4 = 8 groups."""
  from transformers import FlaxGPT2LMHeadModel, GPT2Config

  config = GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=4)
  return _hf_text(FlaxGPT2LMHeadModel, config, 2 * _PER_LAYER)


def hf_llama() -> Case:
  """`FlaxLlamaForCausalLM`: 2 layers, hidden 32, 4 query heads sharing 2 key/value
  heads (GQA), rotary position embeddings, SwiGLU MLP 64, RMSNorm.

  Per layer: the key/value heads (each with its 2 query heads, output rows
  too), "query head r of every key/value head" (GQA repeats each key/value
  head twice), the value/output head_dim, the MLP units (gate, up and down
  together): 4. The query/key head_dim is not prunable: rotary embeddings
  multiply it by a per-position sin/cos table made by the model. 2 x 4 = 8.
  """
  from transformers import FlaxLlamaForCausalLM, LlamaConfig

  config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
  return _hf_text(FlaxLlamaForCausalLM, config, 2 * _PER_LAYER)


# -- keras 3 on JAX -----------------------------------------------------------


def _keras(build: Callable[[], Any], image: int, prunable: int, values: bool = True) -> Case:
  """A keras model as `fn({'trainable': ..., 'non_trainable': ...}, x)`.

  Leaves are keyed by each variable's path (`conv1/kernel`), so the groups
  name the keras layers. `fn` calls `model.stateless_call` in inference mode
  and returns the predictions.
  """
  import keras

  if keras.backend.backend() != 'jax':
    raise RuntimeError(f'keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax '
                       'before keras is first imported.')
  model = build()
  trainable = {v.path: v.value for v in model.trainable_variables}
  non_trainable = {v.path: v.value for v in model.non_trainable_variables}
  variables = {'trainable': trainable, 'non_trainable': non_trainable}
  variables = random_like(variables) if values else jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), variables)

  def fn(variables, x):
    out, _ = model.stateless_call([variables['trainable'][v.path] for v in model.trainable_variables],
                                  [variables['non_trainable'][v.path]
                                   for v in model.non_trainable_variables], x, training=False)
    return out

  inputs = ((lambda b: (normal(b, image, image, 3),)) if values else
            (lambda b: (jax.ShapeDtypeStruct((b, image, image, 3), jnp.float32),)))
  return Case('keras', fn, variables, inputs, prunable)


def keras_mobilenet_v2() -> Case:
  """`keras.applications.MobileNetV2(alpha=0.35)` on 32x32 images, 10 classes.

  25 prunable groups, as Torch-Pruning counts torchvision's MobileNetV2 (the
  width multiplier changes no tie): the stem with the first block's depthwise
  conv (1); each of the 16 expanding blocks' expanded channels, tied through
  its depthwise conv (16); the 7 bottleneck streams (16, 24, 32, 64, 96, 160,
  320 channels at alpha 1), each tied across its stage by the residual adds
  (7); the last 1x1 conv before pooling (1).
  """
  import keras

  build = lambda: keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                                 weights=None, classes=10)
  return _keras(build, 32, 25)


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


# name -> builder. The full-size models (names ending in `_full`) are shapes
# only: their tests trace them and count their groups.
ZOO: dict[str, Callable[[], Case]] = {
    'haiku_resnet18': haiku_resnet18,
    'haiku_resnet18_train': functools.partial(haiku_resnet18, train=True),
    'haiku_resnet50_full': haiku_resnet50_full,
    'haiku_mobilenet_v1': haiku_mobilenet_v1,
    'equinox_mlp': equinox_mlp,
    'equinox_cnn': equinox_cnn,
    'equinox_cnn_train': functools.partial(equinox_cnn, train=True),
    'hf_resnet': hf_resnet,
    'hf_regnet': hf_regnet,
    'hf_vit': hf_vit,
    'hf_beit': hf_beit,
    'hf_dinov2': hf_dinov2,
    'hf_clip': hf_clip,
    'hf_bert': hf_bert,
    'hf_gpt2': hf_gpt2,
    'hf_llama': hf_llama,
    'keras_mobilenet_v2': keras_mobilenet_v2,
    'keras_densenet121_full': keras_densenet121_full,
    'keras_resnet50_full': keras_resnet50_full,
}
