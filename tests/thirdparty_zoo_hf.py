"""Hugging Face transformers 4.x Flax models for the third-party zoo.

Built from configs with random params drawn for the model's own param shapes;
`model.__call__(..., params=params)` makes the attention masks, positions and
BERT's head mask as it does for any user.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
from thirdparty_zoo import Case, PyTree, normal, random_like, token_ids


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


def hf_resnet(
  embedding: int = 16,
  hidden_sizes: tuple[int, ...] = (32, 64, 128, 256),
  depths: tuple[int, ...] = (1, 1, 2, 1),
  image: int = 32,
) -> Case:
  """`FlaxResNetForImageClassification`, bottleneck layers, 16-stem, 32-64-128-256
  stage widths with 1-1-2-1 layers, 32x32 images.

  As for any bottleneck ResNet: the stem (1), two inside each bottleneck (5
  layers: 10), one residual stream per stage (every first layer projects: 4).
  15. The full ResNet-50 config gives 1 + 2 * 16 + 4 = 37.
  """
  from transformers import FlaxResNetForImageClassification, ResNetConfig

  config = ResNetConfig(
    embedding_size=embedding,
    hidden_sizes=list(hidden_sizes),
    depths=list(depths),
    layer_type='bottleneck',
    num_labels=10,
    image_size=image,
  )
  return _hf_image(FlaxResNetForImageClassification, config, 1 + 2 * sum(depths) + len(depths))


def hf_regnet(
  embedding: int = 16,
  hidden_sizes: tuple[int, ...] = (16, 32),
  depths: tuple[int, ...] = (1, 2),
  groups_width: int = 8,
  image: int = 32,
) -> Case:
  """`FlaxRegNetForImageClassification`, RegNetY layers (1x1 conv, grouped 3x3 conv,
  squeeze-excitation, 1x1 conv), 16-stem, 16-32 stage widths with 1-2 layers,
  conv groups 8 wide, 32x32 images.

  The stem (1) and the two residual streams (every stage's first layer
  projects: 2). Inside each of the 3 layers, the grouped conv (C = G conv
  groups x 8) gives three groups: whole conv groups (input and output), input
  channel j of every conv group, output channel j of every conv group; and
  the squeeze-excitation's reduced channels are a fourth: 12. 15 in all.
  (Every layer of a wider config has more than one conv group of more than
  one channel: 1 + 4 per layer + 1 per stage.)
  """
  from transformers import FlaxRegNetForImageClassification, RegNetConfig

  config = RegNetConfig(
    embedding_size=embedding,
    hidden_sizes=list(hidden_sizes),
    depths=list(depths),
    groups_width=groups_width,
    layer_type='y',
    num_labels=10,
  )
  config.image_size = image
  prunable = 1 + 4 * sum(depths) + len(depths)
  return _hf_image(FlaxRegNetForImageClassification, config, prunable)


# Every text model's vocabulary (token ids are drawn below it).
VOCAB = 100

# A transformer layer has four prunable groups: the attention heads (query,
# key, value and output together), the query/key head_dim, the value/output
# head_dim and the MLP's hidden units. The residual stream is reduced over by
# LayerNorm, so it is not prunable.
_PER_LAYER = 4


def hf_vit(
  hidden: int = 32, layers: int = 2, heads: int = 4, image: int = 32, patch: int = 8
) -> Case:
  """`FlaxViTForImageClassification`: 2 layers, hidden 32, 4 heads, MLP 2 x hidden,
  8x8 patches of 32x32 images. 2 layers x 4 = 8 groups."""
  from transformers import FlaxViTForImageClassification, ViTConfig

  config = ViTConfig(
    image_size=image,
    patch_size=patch,
    hidden_size=hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    intermediate_size=2 * hidden,
    num_labels=10,
  )
  return _hf_image(FlaxViTForImageClassification, config, layers * _PER_LAYER)


def hf_beit() -> Case:
  """`FlaxBeitForImageClassification` with a relative position bias per layer (a
  table of (distances, heads) gathered per query/key pair: its heads axis is
  the layer's heads), layer scale, mean pooling: 2 layers x 4 = 8 groups."""
  from transformers import BeitConfig, FlaxBeitForImageClassification

  config = BeitConfig(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    num_labels=10,
    use_relative_position_bias=True,
  )
  return _hf_image(FlaxBeitForImageClassification, config, 2 * _PER_LAYER)


def hf_dinov2() -> Case:
  """`FlaxDinov2ForImageClassification`: 2 layers, hidden 32, 4 heads, MLP ratio 2,
  position embeddings interpolated to the image, layer scale: 2 x 4 = 8
  groups. Its `mask_token` is read only with a patch mask, never here."""
  from transformers import Dinov2Config, FlaxDinov2ForImageClassification

  config = Dinov2Config(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    mlp_ratio=2,
    num_labels=10,
  )
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

  text = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=16,
  )
  vision = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
  )
  config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
  model, params = _hf(FlaxCLIPModel, config)
  fn = lambda params, ids, pixels: model(ids, pixels, params=params, train=False).logits_per_image
  inputs = lambda b: (token_ids(b, 8, VOCAB), normal(b, 3, 32, 32))
  return Case('transformers', fn, params, inputs, 4 * _PER_LAYER)


def _hf_text(model_class: Any, config: Any, prunable: int, length: int = 8) -> Case:
  """An HF Flax text model as `fn(params, input_ids)` through `model.__call__`,
  which makes the attention mask, positions (and BERT's head mask) itself."""
  model, params = _hf(model_class, config)
  fn = lambda params, ids: model(ids, params=params, train=False).logits
  return Case(
    'transformers', fn, params, lambda b: (token_ids(b, length, config.vocab_size),), prunable
  )


def hf_bert(hidden: int = 32, layers: int = 2, heads: int = 4, length: int = 8) -> Case:
  """`FlaxBertForSequenceClassification`: 2 layers, hidden 32, 4 heads, MLP 2 x hidden.

  2 x 4 groups, plus the pooler's units (a tanh Dense between the [CLS]
  token and the classifier): 9. `model.__call__` passes a head mask
  `ones((layers, heads))`; each layer multiplies by its own row, so each
  layer keeps its own heads group.
  """
  from transformers import BertConfig, FlaxBertForSequenceClassification

  config = BertConfig(
    vocab_size=VOCAB,
    hidden_size=hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    intermediate_size=2 * hidden,
    max_position_embeddings=max(16, length),
    num_labels=3,
  )
  return _hf_text(FlaxBertForSequenceClassification, config, layers * _PER_LAYER + 1, length)


def hf_gpt2() -> Case:
  """`FlaxGPT2LMHeadModel`: 2 layers, 32 wide, 4 heads, MLP 128 (4 x 32). One
  fused query-key-value projection split in three, causal mask, LM head tied
  to the token embedding: 2 x 4 = 8 groups."""
  from transformers import FlaxGPT2LMHeadModel, GPT2Config

  config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4)
  return _hf_text(FlaxGPT2LMHeadModel, config, 2 * _PER_LAYER)


def hf_llama(
  hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2, length: int = 8
) -> Case:
  """`FlaxLlamaForCausalLM`: 2 layers, hidden 32, 4 query heads sharing 2 key/value
  heads (GQA), rotary position embeddings, SwiGLU MLP 64, RMSNorm.

  Per layer: the key/value heads (each with its 2 query heads, output rows
  too), "query head r of every key/value head" (GQA repeats each key/value
  head twice), the value/output head_dim, the MLP units (gate, up and down
  together), and the query/key head_dim in pairs: rotary embeddings rotate
  dimensions j and j + 4 of each head together (by a sin/cos table the model
  computes from the positions, which a shrink cuts like any constant), so
  the 8 dims make 4 channels. 2 x 5 = 10.
  """
  from transformers import FlaxLlamaForCausalLM, LlamaConfig

  config = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=hidden,
    intermediate_size=2 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    max_position_embeddings=max(16, length),
  )
  return _hf_text(FlaxLlamaForCausalLM, config, layers * (_PER_LAYER + 1), length)


def hf_roformer(hidden: int = 32, layers: int = 2, heads: int = 4, length: int = 8) -> Case:
  """`FlaxRoFormerForSequenceClassification`: 2 layers, hidden 32, 4 heads, MLP
  2 x hidden, interleaved rotary position embeddings.

  Per layer the four groups of `_PER_LAYER`, the query/key head_dim in pairs:
  RoFormer rotates dims 2i and 2i + 1 of each head together
  (`jnp.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)`, by a sin/cos
  table stacked the same way), so the 8 dims make 4 channels. Plus the
  classifier head's hidden units (a tanh Dense): 2 x 4 + 1 = 9.
  """
  from transformers import FlaxRoFormerForSequenceClassification, RoFormerConfig

  config = RoFormerConfig(
    vocab_size=VOCAB,
    hidden_size=hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    intermediate_size=2 * hidden,
    max_position_embeddings=max(16, length),
    num_labels=3,
  )
  return _hf_text(FlaxRoFormerForSequenceClassification, config, layers * _PER_LAYER + 1, length)


def hf_gptj(hidden: int = 32, layers: int = 2, heads: int = 4, length: int = 8) -> Case:
  """`FlaxGPTJForCausalLM`: 2 layers, 32 wide, 4 heads of 8 dims, MLP 128, rotary
  embeddings on the first 4 dims of each head only (`rotary_dim`, as GPT-J's
  64 of 256).

  Per layer the four groups of `_PER_LAYER`, and the query/key head_dim makes
  two: the rotated dims in interleaved pairs (2i, 2i + 1), 2 channels, and the
  4 dims that pass unrotated, one channel each. 2 x 5 = 10.
  """
  from transformers import FlaxGPTJForCausalLM, GPTJConfig

  config = GPTJConfig(
    vocab_size=VOCAB,
    n_positions=max(16, length),
    n_embd=hidden,
    n_layer=layers,
    n_head=heads,
    rotary_dim=hidden // heads // 2,
  )
  return _hf_text(FlaxGPTJForCausalLM, config, layers * (_PER_LAYER + 1), length)
