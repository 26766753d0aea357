"""jaxprune.oneshot.matmul_weights: the prune_filter of a model's matmul weights, from its jaxpr.

Each model is built from its library's own modules (tiny configs, random weights); the
expected names are written out from each architecture (which of its leaves are matmul
weights), not taken from the function under test.
"""

import os
import re

os.environ.setdefault('KERAS_BACKEND', 'jax')

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxprune
from jaxprune import oneshot

TARGET = 0.5


def gradual_run(fn, params, args, weights, steps=4, **fields):
  """A few steps of `pruned(adam)` on a loss of the model's output: each selected leaf
  reaches TARGET (exact thresholds, full target from step 2), the others get no mask."""
  tx = jaxprune.pruned(
    optax.adam(1e-3),
    target_sparsity=TARGET,
    sparsity_function_end_step=2,
    pruning_frequency=1,
    threshold_method='exact',
    prune_filter=weights,
    **fields,
  )
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.grad(lambda p: jnp.mean(jnp.square(fn(p, *args).astype(jnp.float32))))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  before = jaxprune.get_weight_sparsity(params)
  for _ in range(steps):
    params, state = step(params, state)
  masked = {name for name, _ in jaxprune.named_leaves(jaxprune.get_masks(state))}
  assert masked == set(weights.names)
  after = jaxprune.get_weight_sparsity(params)
  for name, sparsity in after.items():
    if name in weights.names:
      assert float(sparsity) == TARGET, name  # every size here is even, weights random
    else:
      assert float(sparsity) <= float(before[name]), name
  return params


# --- small models: the rule, sub-jaxprs, the errors ---------------------------------------


def test_selects_the_matmul_weight_and_says_why_the_others_are_left_out():
  params = {
    'w': jnp.ones((4, 3)),
    'b': jnp.ones(3),
    'scale': jnp.ones(4),
    'emb': jnp.ones((10, 4)),
    'unused': jnp.ones((3, 3)),
    'steps': jnp.int32(0),
  }

  def fn(p, tokens):
    x = p['emb'][tokens] * p['scale']
    return x @ p['w'] + p['b'] + p['steps']

  weights = oneshot.matmul_weights(fn, params, jnp.zeros((2,), jnp.int32))
  assert weights.names == ('w',)
  assert weights.reasons == {
    'b': 'read by add, not only as a matmul weight',
    'emb': 'read by a gather, as an embedding lookup is',
    'scale': 'read by mul, not only as a matmul weight',
    'steps': 'read by add, not only as a matmul weight',
    'unused': 'not read by fn on the example arguments',
  }
  assert weights('w', None) and not weights('b', None)
  assert str(weights).splitlines()[0] == 'w       pruned'
  assert 'emb     dense: read by a gather' in str(weights)


def test_a_tied_embedding_is_left_dense_and_the_reason_says_it_is_also_a_matmul_weight():
  params = {'emb': jnp.ones((10, 4)), 'w': jnp.ones((4, 4))}
  weights = oneshot.matmul_weights(
    lambda p, t: (p['emb'][t] @ p['w']) @ p['emb'].T, params, jnp.zeros(3, jnp.int32)
  )
  assert weights.names == ('w',)
  assert weights.reasons['emb'] == (
    'read by a gather, as an embedding lookup is, and elsewhere as a matmul weight'
  )


def test_follows_jit_remat_custom_jvp_custom_vjp_and_convolutions():
  @jax.custom_vjp
  def product(x, w):
    return x @ w

  product.defvjp(lambda x, w: (x @ w, (x, w)), lambda r, g: (g @ r[1].T, r[0].T @ g))

  @jax.custom_jvp
  def scaled(x, w):
    return 2.0 * (x @ w)

  scaled.defjvp(lambda p, t: (scaled(*p), 2.0 * (t[0] @ p[1] + p[0] @ t[1])))

  def fn(p, x):
    h = jax.jit(lambda x, w: x @ w)(x, p['jit'])
    h = jax.checkpoint(lambda h, w: jnp.tanh(h @ w))(h, p['remat'])
    h = product(h, p['vjp'])
    h = scaled(h, p['jvp'])
    image = h.reshape(1, 4, 4, 1)
    return jax.lax.conv_general_dilated(
      image, p['conv'], (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )

  params = {k: jnp.ones((16, 16)) for k in ('jit', 'remat', 'vjp', 'jvp')}
  params['conv'] = jnp.ones((3, 3, 1, 2))
  weights = oneshot.matmul_weights(fn, params, jnp.ones((1, 16)))
  assert set(weights.names) == {'jit', 'remat', 'vjp', 'jvp', 'conv'}
  assert weights.reasons == {}


def test_a_block_diagonal_weight_is_selected_and_an_elementwise_einsum_is_not():
  """dot_general with batch dimensions: a weight when it contracts some of its axes."""
  params = {'blocks': jnp.ones((2, 4, 4)), 'scale': jnp.ones(8)}

  def fn(p, x):
    h = jnp.einsum('bhi,hij->bhj', x.reshape(-1, 2, 4), p['blocks']).reshape(-1, 8)
    return jnp.einsum('bd,d->bd', h, p['scale'])

  weights = oneshot.matmul_weights(fn, params, jnp.ones((3, 8)))
  assert weights.names == ('blocks',)
  assert weights.reasons['scale'].startswith('multiplied elementwise')


def test_no_weight_found_is_one_line_naming_the_fix():
  model = nn.Dense(4)
  params = model.init(jax.random.key(0), jnp.ones((1, 3)))['params']
  closed_over = {'Dense_0': jax.tree.map(jnp.zeros_like, params)}
  with pytest.raises(ValueError, match='did you pass the params the function uses') as err:
    oneshot.matmul_weights(
      lambda p, x: model.apply({'params': params}, x), closed_over, jnp.ones((1, 3))
    )
  assert '\n' not in str(err.value) and 'reads none of the 2 params leaves' in str(err.value)
  with pytest.raises(ValueError, match=r"as a matmul or convolution weight \('b': read by add"):
    oneshot.matmul_weights(lambda p, x: x + p['b'], {'b': jnp.ones(3)}, jnp.ones(3))
  with pytest.raises(
    ValueError, match=r'^oneshot.matmul_weights: fn\(params, \*example_args\) raised'
  ):
    oneshot.matmul_weights(lambda p, x: x @ p['w'], {'w': jnp.ones((3, 4))}, jnp.ones(5))


@pytest.mark.slow
def test_the_filter_serves_one_collection_of_the_variables_it_read():
  model = nn.Sequential([nn.Dense(4), nn.LayerNorm(), nn.Dense(2)])
  variables = model.init(jax.random.key(0), jnp.ones((1, 3)))
  weights = oneshot.matmul_weights(model.apply, variables, jnp.ones((1, 3)))
  assert weights.names == ('params/layers_0/kernel', 'params/layers_2/kernel')
  # The optimizer of variables['params'] names its leaves without the collection.
  assert weights('layers_0/kernel', None) and not weights('layers_1/scale', None)
  with pytest.raises(ValueError, match=r"^prune_filter: leaf 'Dense_7/kernel' is not in"):
    weights('Dense_7/kernel', None)
  # A Linen module's apply given the 'params' collection itself: called on {'params': p}.
  params = variables['params']
  direct = oneshot.matmul_weights(model.apply, params, jnp.ones((1, 3)))
  assert direct.names == ('layers_0/kernel', 'layers_2/kernel')
  gradual_run(lambda p, x: model.apply({'params': p}, x), params, (jnp.ones((2, 3)),), direct)


# --- a MaxText-style Linen decoder: scanned layers, the layer axis at 1 ---------------------


class RMSNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


class DecoderLayer(nn.Module):
  """MaxText's layer: DenseGeneral q/k/v/out over (heads, head_dim), a gated MLP."""

  heads: int = 2
  head_dim: int = 8
  mlp: int = 32

  @nn.compact
  def __call__(self, x, _):
    embed = x.shape[-1]
    h = RMSNorm(name='pre_self_attention_norm')(x)
    proj = {
      name: nn.DenseGeneral((self.heads, self.head_dim), use_bias=False, name=name)(h)
      for name in ('query', 'key', 'value')
    }
    logits = jnp.einsum('bqhd,bkhd->bhqk', proj['query'], proj['key'])
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9), -1)
    attended = jnp.einsum('bhqk,bkhd->bqhd', probs, proj['value'])
    x = x + nn.DenseGeneral(embed, axis=(-2, -1), use_bias=False, name='out')(attended)
    h = RMSNorm(name='post_self_attention_norm')(x)
    gate = nn.DenseGeneral(self.mlp, use_bias=False, name='wi_0')(h)
    up = nn.DenseGeneral(self.mlp, use_bias=False, name='wi_1')(h)
    x = x + nn.DenseGeneral(embed, use_bias=False, name='wo')(nn.silu(gate) * up)
    return x, None


class Decoder(nn.Module):
  vocab: int = 64
  embed: int = 16
  layers: int = 3

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab, self.embed, name='token_embedder')(tokens)
    scanned = nn.scan(
      nn.remat(DecoderLayer, prevent_cse=False),
      variable_axes={'params': 1},  # MaxText's param_scan_axis=1
      split_rngs={'params': True},
      in_axes=nn.broadcast,
      length=self.layers,
    )
    x, _ = scanned(name='layers')(x, None)
    x = RMSNorm(name='decoder_norm')(x)
    return nn.DenseGeneral(self.vocab, use_bias=False, name='logits_dense')(x)


@pytest.mark.slow
def test_maxtext_style_linen_decoder_scanned_on_axis_1():
  model = Decoder()
  tokens = jnp.arange(12).reshape(2, 6) % 64
  params = jax.jit(model.init)(jax.random.key(0), tokens)['params']
  assert params['layers']['query']['kernel'].shape == (16, 3, 2, 8)  # (embed, layers, ...)
  weights = oneshot.matmul_weights(model.apply, params, tokens)
  stacked = [f'layers/{n}/kernel' for n in ('key', 'out', 'query', 'value', 'wi_0', 'wi_1', 'wo')]
  assert set(weights.names) == {'logits_dense/kernel', *stacked}
  assert weights.stacked_axes == dict.fromkeys(stacked, 1)
  assert set(weights.reasons) == {
    'decoder_norm/scale',
    'layers/post_self_attention_norm/scale',
    'layers/pre_self_attention_norm/scale',
    'token_embedder/embedding',
  }
  assert weights.reasons['token_embedder/embedding'].startswith('read by a gather')
  assert weights.layer_axes_map == [f'^{n}$:@1' for n in stacked]
  pruned = gradual_run(
    lambda p, t: model.apply({'params': p}, t),
    params,
    (tokens,),
    weights,
    layer_axes_map=weights.layer_axes_map,
  )
  for name in ('query', 'wi_0', 'wo'):  # each of the 3 layers at TARGET on its own
    kernel = pruned['layers'][name]['kernel']
    per_layer = jnp.moveaxis(kernel == 0, 1, 0).reshape(3, -1).mean(axis=1)
    assert per_layer.tolist() == [TARGET] * 3, name


# --- gemma's layout: Einsum modules whose weight is `w`, `gating_einsum`, `linear` ---------
# gemma (gemma.gm.nn) imports kauldron, whose dependencies (xmanager, google-cloud-*,
# tensorflow-datasets; protobuf 7 -> 6) are not installed here: its modules' parameter
# names and einsums (gm/nn/_layers.py, _modules.py) are written out below.


class Einsum(nn.Module):
  shape: tuple[int, ...]
  weight_name: str = 'w'

  @nn.compact
  def __call__(self, eqn, x):
    return jnp.einsum(eqn, x, self.param(self.weight_name, nn.initializers.normal(), self.shape))


class GemmaRMSNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.zeros_init(), (x.shape[-1],))
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * (1 + scale)


class GemmaBlock(nn.Module):
  heads: int = 2
  kv_heads: int = 1
  head_dim: int = 8
  hidden: int = 32

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    h = GemmaRMSNorm(name='pre_attention_norm')(x)
    q = Einsum((self.heads, d, self.head_dim), name='q_einsum')('BTD,NDH->BTNH', h)
    k, v = Einsum((2, self.kv_heads, d, self.head_dim), name='kv_einsum')('BSD,CKDH->CBSKH', h)
    k, v = (jnp.repeat(a, self.heads // self.kv_heads, axis=2) for a in (k, v))
    probs = jax.nn.softmax(jnp.einsum('BTNH,BSNH->BTNS', q, k), axis=-1)
    attended = jnp.einsum('BTNS,BSNH->BTNH', probs, v)
    x = x + Einsum((self.heads, self.head_dim, d), name='attn_vec_einsum')(
      'BTNH,NHD->BTD', attended
    )
    h = GemmaRMSNorm(name='pre_ffw_norm')(x)
    gate = Einsum((2, d, self.hidden), 'gating_einsum', name='mlp')('...F,NFH->...NH', h)
    up = nn.gelu(gate[..., 0, :]) * gate[..., 1, :]
    return x + Einsum((self.hidden, d), 'linear', name='mlp_out')('...H,HF->...F', up)


class GemmaLM(nn.Module):
  vocab: int = 64
  d: int = 16

  @nn.compact
  def __call__(self, tokens):
    table = self.param('input_embedding_table', nn.initializers.normal(), (self.vocab, self.d))
    x = table[tokens] * jnp.sqrt(self.d)
    for i in range(2):
      x = GemmaBlock(name=f'layer_{i}')(x)
    return GemmaRMSNorm(name='final_norm')(x) @ table.T  # the LM head: the tied table


@pytest.mark.slow
def test_gemma_layout_none_of_whose_weights_the_default_regex_matches():
  model = GemmaLM()
  tokens = jnp.arange(12).reshape(2, 6) % 64
  params = jax.jit(model.init)(jax.random.key(0), tokens)['params']
  default = jaxprune.get_pruning_hparams().weight_name_regex
  assert [name for name, _ in jaxprune.named_leaves(params) if re.search(default, name)] == []
  weights = oneshot.matmul_weights(model.apply, params, tokens)
  einsums = (
    'q_einsum/w',
    'kv_einsum/w',
    'attn_vec_einsum/w',
    'mlp/gating_einsum',
    'mlp_out/linear',
  )
  assert set(weights.names) == {f'layer_{i}/{n}' for i in (0, 1) for n in einsums}
  norms = [f'layer_{i}/{n}/scale' for i in (0, 1) for n in ('pre_attention_norm', 'pre_ffw_norm')]
  assert set(weights.reasons) == {'input_embedding_table', 'final_norm/scale', *norms}
  assert weights.reasons['input_embedding_table'].endswith('and elsewhere as a matmul weight')
  gradual_run(lambda p, t: model.apply({'params': p}, t), params, (tokens,), weights)


# --- a Flax NNX transformer: biases, two norms, an LM head tied to the embedding ------------


class Block(nnx.Module):
  def __init__(self, d: int, rngs: nnx.Rngs):
    self.ln1 = nnx.LayerNorm(d, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(2, d, decode=False, rngs=rngs)
    self.ln2 = nnx.RMSNorm(d, rngs=rngs)
    self.up = nnx.Linear(d, 2 * d, rngs=rngs)
    self.down = nnx.Linear(2 * d, d, use_bias=False, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.ln1(x), mask=nnx.make_causal_mask(x[..., 0]))
    return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class TiedLM(nnx.Module):
  def __init__(self, vocab: int, d: int, layers: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, d, rngs=rngs)
    self.blocks = nnx.List([Block(d, rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(d, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x)
    return self.embed.attend(self.norm(x))


@pytest.mark.slow
def test_flax_nnx_transformer_with_a_tied_lm_head():
  model = TiedLM(64, 16, 2, nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tokens = jnp.arange(12).reshape(2, 6) % 64

  def fn(p, t):
    return nnx.merge(graphdef, p, rest)(t)

  weights = oneshot.matmul_weights(fn, params, tokens)
  kernels = ('attn/key', 'attn/out', 'attn/query', 'attn/value', 'down', 'up')
  assert set(weights.names) == {f'blocks/{i}/{k}/kernel' for i in (0, 1) for k in kernels}
  biases = ('attn/key', 'attn/out', 'attn/query', 'attn/value', 'ln1', 'up')
  assert set(weights.reasons) == {
    'embed/embedding',
    'norm/bias',
    'norm/scale',
    *(f'blocks/{i}/{k}/bias' for i in (0, 1) for k in biases),
    *(f'blocks/{i}/{n}/scale' for i in (0, 1) for n in ('ln1', 'ln2')),
  }
  assert weights.reasons['embed/embedding'].endswith('and elsewhere as a matmul weight')
  assert weights.reasons['blocks/0/up/bias'] == 'read by add, not only as a matmul weight'
  gradual_run(fn, params, (tokens,), weights)


# --- the LM libraries' own modules (the `lm` extra) -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('layer_stack', [False, True])
def test_penzai_llamalike_transformer(layer_stack):
  pytest.importorskip('penzai', reason='penzai is in the lm extra: pip install jaxprune[lm]')
  from penzai import pz
  from penzai.models.transformer.variants import llamalike_common

  config = llamalike_common.LlamalikeTransformerConfig(
    num_kv_heads=2,
    query_head_multiplier=1,
    embedding_dim=16,
    projection_dim=8,
    mlp_hidden_dim=32,
    num_decoder_blocks=2,
    vocab_size=64,
    mlp_variant='geglu_approx',
    tie_embedder_and_logits=not layer_stack,
    use_layer_stack=layer_stack,
  )
  model = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
  unbound, frozen = pz.unbind_params(model, freeze=True)
  params = {param.label: param for param in frozen}
  tokens = pz.nx.wrap(jnp.arange(12).reshape(2, 6) % 64).tag('batch', 'seq')

  def fn(p, t):
    return pz.bind_variables(unbound, p.values())(t).unwrap('batch', 'seq', 'vocabulary')

  weights = oneshot.matmul_weights(fn, params, tokens)
  blocks = ['blocks'] if layer_stack else ['block_0', 'block_1']
  linears = [
    *(f'attention/{n}' for n in ('key', 'output', 'query', 'value')),
    *(f'mlp/{n}' for n in ('gating_linear', 'out_linear', 'value_linear')),
  ]
  expected = {f'transformer/{b}/{n}.weights' for b in blocks for n in linears}
  if layer_stack:  # untied: the LM head is a Linear of its own
    expected.add('transformer/lm_head.weights')
  assert set(weights.names) == {f'{n}/value/data_array' for n in expected}
  norms = [
    f'transformer/{b}/{n}/scale.weights'
    for b in blocks
    for n in ('pre_attention_norm', 'pre_ffw_norm')
  ]
  dense = {'transformer/embedder.embeddings', 'transformer/final_norm/scale.weights', *norms}
  assert set(weights.reasons) == {f'{n}/value/data_array' for n in dense}
  embedding = weights.reasons['transformer/embedder.embeddings/value/data_array']
  assert embedding.endswith('and elsewhere as a matmul weight') != layer_stack
  if layer_stack:
    assert set(weights.stacked_axes.values()) == {0}
  gradual_run(fn, params, (tokens,), weights)


@pytest.mark.slow
def test_keras_hub_llama_causal_lm_with_reverse_embeddings():
  keras = pytest.importorskip('keras')
  keras_hub = pytest.importorskip('keras_hub', reason='keras-hub is in the lm extra')
  if keras.backend.backend() != 'jax':
    pytest.skip(f'keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax')
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.LlamaBackbone(
    vocabulary_size=64,
    num_layers=2,
    num_query_heads=2,
    num_key_value_heads=1,
    hidden_dim=16,
    intermediate_dim=32,
    tie_word_embeddings=False,
  )
  lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
  variables = lm.trainable_variables
  others = [v.value for v in lm.non_trainable_variables]
  params = {v.path: v.value for v in variables}
  tokens = jnp.arange(12).reshape(2, 6) % 64
  inputs = {'token_ids': tokens, 'padding_mask': jnp.ones_like(tokens)}

  def fn(p, x):
    return lm.stateless_call([p[v.path] for v in variables], others, x)[0]

  weights = oneshot.matmul_weights(fn, params, inputs)
  layer = [
    *(f'self_attention/{n}/kernel' for n in ('query', 'key', 'value', 'attention_output')),
    *(f'feedforward_{n}_dense/kernel' for n in ('intermediate', 'gate', 'output')),
  ]
  expected = {f'transformer_layer_{i}/{n}' for i in (0, 1) for n in layer}
  assert set(weights.names) == {'token_embedding/reverse_embeddings', *expected}
  norms = [
    f'transformer_layer_{i}/{n}/scale'
    for i in (0, 1)
    for n in ('self_attention_layernorm', 'feedforward_layernorm')
  ]
  assert set(weights.reasons) == {
    'token_embedding/embeddings',
    'sequence_output_layernorm/scale',
    *norms,
  }
  gradual_run(fn, params, (inputs,), weights)


@pytest.mark.slow
def test_recurrentgemma_griffin():
  recurrentgemma = pytest.importorskip(
    'recurrentgemma.jax', reason='recurrentgemma pins absl-py<2: not in the lm extra'
  )
  config = recurrentgemma.GriffinConfig(
    vocab_size=64,
    width=16,
    mlp_expanded_width=32,
    num_heads=2,
    block_types=(
      recurrentgemma.TemporalBlockType.RECURRENT,
      recurrentgemma.TemporalBlockType.ATTENTION,
    ),
    embeddings_scale_by_sqrt_dim=True,
    attention_window_size=8,
    logits_soft_cap=30.0,
  )
  model = recurrentgemma.Griffin(config)
  tokens = jnp.arange(12).reshape(2, 6) % 64
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
  params = model.init(jax.random.key(0), tokens, positions)['params']

  def fn(p, t, s):
    return model.apply({'params': p}, t, s)[0]

  weights = oneshot.matmul_weights(fn, params, tokens, positions)
  recurrent = ['linear_out/kernel', 'linear_x/kernel', 'linear_y/kernel']
  recurrent += ['rg_lru/a_gate/w', 'rg_lru/input_gate/w']  # block-diagonal, per head
  attention = [f'proj_{n}/kernel' for n in ('final', 'k', 'q', 'v')]
  assert set(weights.names) == {
    *(f'blocks.{i}/mlp_block/{n}' for i in (0, 1) for n in ('ffw_up/w', 'ffw_down/kernel')),
    *(f'blocks.0/recurrent_block/{n}' for n in recurrent),
    *(f'blocks.1/attention_block/{n}' for n in attention),
  }
  # The depthwise temporal convolution is sliced and multiplied elementwise: not a matmul.
  assert weights.reasons['blocks.0/recurrent_block/conv_1d/w'].startswith('read by slice')
  assert weights.reasons['embedder/input_embedding'].endswith('and elsewhere as a matmul weight')
  assert all(
    name.endswith(('/b', '/bias', '/scale', 'a_param', 'conv_1d/w', 'embedding'))
    for name in weights.reasons
  )
  gradual_run(fn, params, (tokens, positions), weights)


@pytest.mark.slow
def test_the_gradual_guides_cells_prune_the_kernels_and_leave_the_rest_dense(capsys):
  from docs_blocks import code_cells

  [setup] = code_cells('guides/gradual.md', end='## The schedule')
  cells = code_cells(
    'guides/gradual.md', '## Choosing the weights from the model', '## Per-leaf settings'
  )
  scope = {}
  for cell in [setup, *cells]:
    exec(cell, scope)  # noqa: S102 - the page's own code
  out = capsys.readouterr().out.splitlines()
  kernels = [f'layers_{i}/kernel' for i in (0, 2, 4)]
  biases = [f'layers_{i}/bias' for i in (0, 2, 4)]
  assert out[:6] == [f'{k}  pruned' for k in kernels] + [
    f'{b}    dense: read by add, not only as a matmul weight' for b in biases
  ]
  # The kernels alone are pruned, to 0.8 within the default histogram thresholds' error.
  sparsity = eval(out[6])  # noqa: S307 - the dict the page prints
  assert sparsity.keys() == set(kernels) and all(abs(s - 0.8) <= 0.002 for s in sparsity.values())
  table = dict(line.split(maxsplit=1) for line in out[7:])
  assert {name for name, what in table.items() if what == 'pruned'} == {
    'Dense_0/kernel',
    'Dense_1/kernel',
  }
  assert table['Embed_0/embedding'] == (
    'dense: read by a gather, as an embedding lookup is, and elsewhere as a matmul weight'
  )
  assert table['LayerNorm_0/scale'] == 'dense: read by mul, not only as a matmul weight'
