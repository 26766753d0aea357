"""Structured pruning through what JAX LLM code emits, and prunes that fall short.

MaxText wraps every activation in `checkpoint_name` (primitive `name`), scans its layers
under `nn.remat` and constrains shardings; Flax NNX and penzai models add nested `jit`
and custom derivatives. Each identity-like primitive must pass channels through: the
groups are those of the same model without it, worked out by hand. A prune that removes
nothing, or less than asked, says so in its result and in `verify`.
"""

import dataclasses
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore
from jax.interpreters import mlir
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxprune.structured as jps

MESH = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'model'))


@jax.custom_jvp
def _custom_jvp_tanh(h):
  return jnp.tanh(h)


_custom_jvp_tanh.defjvp(lambda p, t: (jnp.tanh(p[0]), t[0] * (1 - jnp.tanh(p[0]) ** 2)))


@jax.custom_vjp
def _custom_vjp_tanh(h):
  return jnp.tanh(h)


_custom_vjp_tanh.defvjp(lambda h: (jnp.tanh(h), h), lambda h, g: (g * (1 - jnp.tanh(h) ** 2),))

# Each wraps the hidden activation h (2, 8) as JAX LLM code does; all compute tanh(h).
WRAPPERS = {
  'name': lambda h: jnp.tanh(checkpoint_name(h, 'mlpwi')),
  'optimization_barrier': lambda h: jnp.tanh(jax.lax.optimization_barrier(h)),
  'remat2': jax.checkpoint(jnp.tanh),  # jax.checkpoint / nn.remat
  'sharding_constraint': lambda h: jnp.tanh(
    jax.lax.with_sharding_constraint(h, NamedSharding(MESH, P('data', None)))
  ),
  'jit': jax.jit(jnp.tanh),
  'custom_jvp_call': _custom_jvp_tanh,
  'custom_vjp_call': _custom_vjp_tanh,
  'copy': lambda h: jnp.tanh(jnp.copy(h)),
}


def _mlp(wrap):
  return lambda p, x: wrap(x @ p['w1']) @ p['w2']


def _params():
  rng = np.random.default_rng(0)
  return {
    'w1': rng.normal(size=(5, 8)).astype(np.float32),
    'w2': rng.normal(size=(8, 3)).astype(np.float32),
  }


X = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5)).astype(np.float32))


def _groups(graph):
  """`{frozenset of (leaf, axis, positions): (size, prunable)}`."""
  return {
    frozenset((m.leaf, m.axis, m.indices.tobytes()) for m in g.members): (g.size, g.prunable)
    for g in graph.groups
    if g.members
  }


@pytest.mark.parametrize('primitive', sorted(WRAPPERS))
def test_an_identity_like_primitive_passes_channels_and_prunes_exactly(primitive):
  fn, params = _mlp(WRAPPERS[primitive]), _params()
  names = [e.primitive.name for e in jax.make_jaxpr(fn)(params, X).eqns]
  assert primitive in names
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # no primitive without a rule
    graph = jps.trace(fn, params, X)
  assert _groups(graph) == _groups(jps.trace(_mlp(jnp.tanh), params, X))
  # By hand: the 8 hidden channels (w1's columns, w2's rows) are the one prunable group.
  [group] = graph.prunable_groups
  assert group.size == 8
  assert {(m.leaf, m.axis) for m in group.members} == {('w1', 1), ('w2', 0)}

  result = jps.prune(fn, params, X, ratio=0.25, progress=False)
  assert result.complete and result.shortfall is None and result.check.shortfall is None
  assert result.plan.num_removed == 2  # floor(0.25 * 8)
  kept = result.plan.kept(group.id)
  assert result.variables['w1'].shape == (5, 6) and result.variables['w2'].shape == (6, 3)
  expected = np.tanh(np.asarray(X, np.float64) @ params['w1'][:, kept]) @ params['w2'][kept]
  np.testing.assert_allclose(result.pruned_fn(result.variables, X), expected, rtol=1e-5)
  assert jps.verify(graph, params, result.plan, X)


# A MaxText-style decoder: Linen, layers under nn.scan and nn.remat, checkpoint_name on
# every activation, logical sharding constraints (a 1-device mesh here).
EMB, HEADS, HEAD_DIM, MLP, VOCAB, LAYERS = 16, 2, 8, 32, 11, 2
RULES = (
  ('activation_batch', 'data'),
  ('activation_length', None),
  ('activation_embed', None),
  ('activation_mlp', None),
  ('activation_heads', None),
  ('activation_kv', None),
)


class _Annotated(nn.Module):
  annotate: bool

  def name_(self, x, name):
    return checkpoint_name(x, name) if self.annotate else x

  def constrain(self, x, axes):
    return nn.with_logical_constraint(x, axes) if self.annotate else x


class RMSNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


class DecoderLayer(_Annotated):
  @nn.compact
  def __call__(self, x, _):
    x = self.name_(
      self.constrain(x, ('activation_batch', 'activation_length', 'activation_embed')),
      'decoder_layer_input',
    )
    y = RMSNorm(name='pre_self_attention_norm')(x)
    proj = lambda n: self.name_(
      nn.DenseGeneral((HEADS, HEAD_DIM), use_bias=False, name=n)(y), f'{n}_proj'
    )
    q, k, v = proj('query'), proj('key'), proj('value')
    q = self.constrain(
      q, ('activation_batch', 'activation_length', 'activation_heads', 'activation_kv')
    )
    s = jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(HEAD_DIM)
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    o = jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(jnp.where(causal, s, -1e9), -1), v)
    o = nn.DenseGeneral(EMB, axis=(-2, -1), use_bias=False, name='out')(o)
    h = x + self.name_(o, 'out_proj')
    y = RMSNorm(name='post_self_attention_norm')(h)
    a = self.name_(nn.Dense(MLP, use_bias=False, name='wi_0')(y), 'mlpwi_0')
    b = self.name_(nn.Dense(MLP, use_bias=False, name='wi_1')(y), 'mlpwi_1')
    m = self.constrain(nn.silu(a) * b, ('activation_batch', 'activation_length', 'activation_mlp'))
    out = h + self.name_(nn.Dense(EMB, use_bias=False, name='wo')(m), 'mlpwo')
    return self.name_(out, 'decoder_layer_output'), None


class Decoder(nn.Module):
  annotate: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, EMB, name='token_embedder')(tokens)
    layer = DecoderLayer
    if self.annotate:
      policy = jax.checkpoint_policies.save_only_these_names('query_proj', 'key_proj')
      layer = nn.remat(DecoderLayer, policy=policy, prevent_cse=False)
    stack = nn.scan(
      layer,
      variable_axes={'params': 0},
      split_rngs={'params': True},
      in_axes=(nn.broadcast,),
      length=LAYERS,
    )
    x, _ = stack(self.annotate, name='layers')(x, None)
    x = RMSNorm(name='decoder_norm')(x)
    return nn.Dense(VOCAB, use_bias=False, name='logits_dense')(x)


TOKENS = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (2, 5)), jnp.int32)


def _primitives(closed):
  found = set()

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      found.add(eqn.primitive.name)
      for sub in jcore.jaxprs_in_params(eqn.params):
        visit(getattr(sub, 'jaxpr', sub))

  visit(closed.jaxpr)
  return found


@pytest.mark.slow  # 10 s on CPU: a two-layer decoder traced, pruned, checked, exported
def test_a_maxtext_style_decoder_prunes_and_exports():
  model = Decoder()
  with jax.set_mesh(MESH), nn.logical_axis_rules(RULES):
    variables = model.init(jax.random.key(0), TOKENS)
    used = _primitives(jax.make_jaxpr(model.apply)(variables, TOKENS))
    assert {'name', 'remat2', 'scan', 'sharding_constraint'} <= used
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      graph = jps.trace(model.apply, variables, TOKENS)
    plain = jps.trace(Decoder(annotate=False).apply, variables, TOKENS)
    assert _groups(graph) == _groups(plain)
    # By hand: the width (16) is summed over by each RMSNorm, so not prunable; the MLP's
    # 32 channels, the 2 heads and each head's query/key and value/out dims are, each
    # group shared by the scanned layers (axis 0 of every leaf is the layer).
    layer = 'params/layers/'
    found = {
      frozenset((m.leaf.removeprefix(layer), m.axis) for m in g.members): g.size
      for g in graph.prunable_groups
    }
    assert found == {
      frozenset({('wi_0/kernel', 2), ('wi_1/kernel', 2), ('wo/kernel', 1)}): MLP,
      frozenset(
        {('query/kernel', 2), ('key/kernel', 2), ('value/kernel', 2), ('out/kernel', 1)}
      ): HEADS,
      frozenset({('query/kernel', 3), ('key/kernel', 3)}): HEAD_DIM,
      frozenset({('value/kernel', 3), ('out/kernel', 2)}): HEAD_DIM,
    }

    result = jps.prune(model, variables, TOKENS, ratio=0.25, progress=False)
    assert result.complete and result.check.ok and result.model_check.ok
    # floor(0.25 * n) of each group: 8 of the MLP's 32, no head of 2, 2 of each 8.
    assert result.plan.num_removed == 8 + 0 + 2 + 2
    params = result.variables['params']['layers']
    assert params['wi_0']['kernel'].shape == (LAYERS, EMB, MLP - 8)
    assert params['query']['kernel'].shape == (LAYERS, EMB, HEADS, HEAD_DIM - 2)
    zeroed = jps.zero_removed(graph, variables, result.plan)
    expected = model.apply(zeroed, TOKENS)
    np.testing.assert_allclose(
      result.apply(result.variables, TOKENS), expected, rtol=1e-5, atol=1e-5
    )

    (b,) = jax.export.symbolic_shape('b')
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), result.variables)
    exported = jax.export.export(jax.jit(result.pruned_fn))(
      specs, jax.ShapeDtypeStruct((b, 5), jnp.int32)
    )
    exported = jax.export.deserialize(exported.serialize())
    for batch in (1, 3):
      tokens = jnp.asarray(np.random.default_rng(batch).integers(0, VOCAB, (batch, 5)), jnp.int32)
      np.testing.assert_allclose(
        exported.call(result.variables, tokens),
        model.apply(zeroed, tokens),
        rtol=1e-5,
        atol=1e-5,
      )


# -- prunes that fall short say so --------------------------------------------------

_opaque_p = jcore.Primitive('opaque_identity')  # a primitive with no channel rule
_opaque_p.def_impl(lambda x: x)
_opaque_p.def_abstract_eval(lambda x: x)
mlir.register_lowering(_opaque_p, lambda ctx, x: [x])


def test_a_prune_that_removes_nothing_says_so_in_its_result_and_verify():
  fn, params = _mlp(lambda h: jnp.tanh(_opaque_p.bind(h))), _params()
  with pytest.warns(UserWarning, match="primitive 'opaque_identity' has no channel rule"):
    result = jps.prune(fn, params, X, ratio=0.25, progress=False)
  assert result.plan.num_removed == 0
  assert not result.complete
  assert result.shortfall.startswith('ratio=0.25 removes nothing: no channel group is prunable')
  assert 'opaque_identity' in result.shortfall
  assert repr(result).startswith('PruneResult(SHORT OF THE TARGET: ratio=0.25 removes nothing')
  assert 'SHORT OF THE TARGET: ratio=0.25 removes nothing' in result.summary()
  # The checks pass (nothing was cut out wrongly) and carry the shortfall.
  assert result.check.ok and not result.check.complete
  assert result.check.shortfall == result.shortfall
  report = jps.verify(result.graph, params, result.plan, X)
  assert report.ok and report.shortfall == result.shortfall
  assert 'SHORT OF THE TARGET' in report.summary()


def test_a_prune_that_removes_less_than_asked_says_how_much():
  fn, params = _mlp(jnp.tanh), _params()
  # ratio 0.5 of 8 channels asks for 4; min_channels=6 keeps 6, so 2 go.
  result = jps.prune(
    fn, params, X, ratio=0.5, constraint=jps.Constraint(min_channels=6), progress=False
  )
  assert result.plan.num_removed == 2
  assert result.shortfall == (
    'ratio=0.5 asks for 4 channels, the plan removes 2: the constraint (min_channels, '
    'min_ratio) keeps more'
  )
  assert jps.verify(result.graph, params, result.plan, X).shortfall == result.shortfall
  # A FLOPs target below what removing 7 of the 8 channels leaves: x @ w1 and h @ w2 cost
  # 2*5*8 + 2*8*3 = 128 multiply-adds dense, 2*5*1 + 2*1*3 = 16 (12.5%) with one channel.
  with pytest.warns(UserWarning, match='cannot be reached'):
    short = jps.prune(fn, params, X, flops_target=0.05, progress=False)
  assert short.plan.num_removed == 7
  assert short.shortfall == (
    'flops_target=0.05 is out of reach within the constraints: removing every channel '
    'they allow (7) keeps 12.5% of the FLOPs'
  )


def test_a_prune_that_removes_what_was_asked_has_no_shortfall():
  fn, params = _mlp(jnp.tanh), _params()
  graph = jps.trace(fn, params, X)
  for plan in (
    jps.select(graph, params, ratio=0.5),
    jps.select(graph, params, ratio=0.5, scope='global'),
    jps.select(graph, params, flops_target=0.5),
  ):
    assert plan.num_removed >= 4 and plan.shortfall is None
    report = jps.verify(graph, params, plan, X)
    assert report.ok and report.complete
    assert 'SHORT' not in plan.summary() + report.summary()


@pytest.mark.slow  # 6-14 s on CPU: penzai's two-block Llama traced, pruned, checked
def test_a_penzai_llama_prunes_its_heads_head_dims_and_mlp():
  pz = pytest.importorskip('penzai.pz')
  llama = pytest.importorskip('penzai.models.transformer.variants.llamalike_common')
  config = llama.LlamalikeTransformerConfig(
    num_kv_heads=HEADS,
    query_head_multiplier=1,
    embedding_dim=EMB,
    projection_dim=HEAD_DIM,
    mlp_hidden_dim=MLP,
    num_decoder_blocks=LAYERS,
    vocab_size=VOCAB,
    mlp_variant='swiglu',
    tie_embedder_and_logits=False,
  )
  model = llama.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
  unbound, params = pz.unbind_params(model, freeze=True)
  values = {p.label: p.value for p in params}

  def forward(values, tokens):  # penzai's model as a function of its parameters
    bound = pz.bind_variables(
      unbound, [dataclasses.replace(p, value=values[p.label]) for p in params]
    )
    return bound(pz.nx.wrap(tokens, 'batch', 'seq')).unwrap('batch', 'seq', 'vocabulary')

  result = jps.prune(forward, values, TOKENS, ratio=0.25, progress=False)
  # By hand, per block: 2 heads; the query/key head dim as 4 rotary pairs (dims j and
  # j + 4 turn together); the value/output head dim, 8; the SwiGLU's 32 channels.
  sizes = sorted(g.size for g in result.graph.prunable_groups)
  assert sizes == sorted([HEADS, HEAD_DIM // 2, HEAD_DIM, MLP] * LAYERS)
  # floor(0.25 * n): no head, 1 pair, 2 dims, 8 channels per block.
  assert result.plan.num_removed == (0 + 1 + 2 + 8) * LAYERS
  assert result.complete and result.check.ok
