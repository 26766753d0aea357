"""Lookups and slices third-party models write: per-head block tables
(BigBird), embeddings under vmap (equinox), interleaved rotary embeddings
(RoFormer, GPT-J), recurrent cells and experts. Each model is built from its
library's own layers; expectations are hand counts and dense models with the
removed channels zeroed by hand."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune.structured as jps

EXACT = jps.Constraint(round_to=1)


def _trace(fn, variables, *args, **kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    return jps.trace(fn, variables, *args, **kwargs)


def _group_of(graph, leaf, axis):
  (part,) = graph.leaf_axes[leaf][axis]
  return graph.groups[part.group_id]


class BlockSparseAttention(nn.Module):
  """Each query block attends to 2 key blocks picked per head (BigBird's random
  blocks): a lookup vmapped over batch and heads, i.e. a gather with
  `operand_batching_dims`. `table=None` takes the block table as an input."""

  heads: int = 4
  head_dim: int = 8
  block: int = 4

  @nn.compact
  def __call__(self, x, table=None):
    b, n, d = x.shape
    if table is None:  # fixed per-head random blocks, as BigBird draws them
      n_blocks = n // self.block
      table = np.random.default_rng(0).integers(0, n_blocks, (self.heads, n_blocks, 2))
      table = jnp.broadcast_to(table, (b, *table.shape))
    q, k, v = (nn.DenseGeneral((self.heads, self.head_dim), name=name)(x) for name in 'qkv')
    blocks = lambda t: t.reshape(
      b, n // self.block, self.block, self.heads, self.head_dim
    ).transpose(0, 3, 1, 2, 4)
    look = jax.vmap(jax.vmap(lambda t, i: t[i]))
    keys, values = look(blocks(k), table), look(blocks(v), table)
    scores = jnp.einsum('bhnqk,bhnrsk->bhnqrs', blocks(q), keys)
    probs = jax.nn.softmax(scores.reshape(*scores.shape[:4], -1), -1).reshape(scores.shape)
    out = jnp.einsum('bhnqrs,bhnrsk->bhnqk', probs, values)
    out = out.transpose(0, 2, 3, 1, 4).reshape(b, n, self.heads, self.head_dim)
    return nn.DenseGeneral(d, axis=(-2, -1), name='o')(out)


@pytest.mark.slow
def test_per_head_block_lookup_prunes_heads_and_runs():
  model = BlockSparseAttention()
  x = jax.random.normal(jax.random.key(1), (2, 16, 8))
  variables = model.init(jax.random.key(0), x)
  graph = _trace(model.apply, variables, x)
  heads = _group_of(graph, 'params/k/kernel', 1)
  # q, k and v heads are one group (the per-head table ties k's and v's heads).
  assert heads.prunable and heads.size == 4
  assert heads is _group_of(graph, 'params/q/kernel', 1)
  assert heads is _group_of(graph, 'params/v/kernel', 1)
  plan = jps.make_plan(graph, {heads.id: [1, 2]})
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  assert new_variables['params']['o']['kernel'].shape == (2, 8, 8)
  # By hand: the dense model with heads 1 and 2 zeroed in q, k, v and o.
  zeroed = jax.tree.map(np.array, variables)
  for name in 'qkv':
    zeroed['params'][name]['kernel'][:, 1:3] = 0
    zeroed['params'][name]['bias'][1:3] = 0
  zeroed['params']['o']['kernel'][1:3] = 0
  np.testing.assert_allclose(
    pruned_fn(new_variables, x), model.apply(zeroed, x), rtol=1e-5, atol=1e-5
  )
  # At another batch and another sequence length too (the table is re-drawn).
  x2 = jax.random.normal(jax.random.key(2), (3, 24, 8))
  np.testing.assert_allclose(
    pruned_fn(new_variables, x2), model.apply(zeroed, x2), rtol=1e-5, atol=1e-5
  )


def test_per_head_table_given_as_input_keeps_heads_whole():
  model = BlockSparseAttention()
  x = jax.random.normal(jax.random.key(1), (2, 16, 8))
  table = jnp.zeros((2, 4, 4, 2), jnp.int32)
  variables = model.init(jax.random.key(0), x, table)
  graph = _trace(model.apply, variables, x, table)
  heads = _group_of(graph, 'params/k/kernel', 1)
  assert not heads.prunable
  assert heads.reason == 'reaches model input 1 axis 1'
  plan = jps.select(graph, variables, ratio=0.5, constraint=EXACT)
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  assert pruned_fn(new_variables, x, table).shape == x.shape


class EqxBlock:
  """A pre-norm transformer of equinox layers over a vmapped `eqx.nn.Embedding`."""

  @staticmethod
  def build(vocab=20, width=16, heads=2, hidden=32):
    import equinox as eqx

    class Block(eqx.Module):
      embed: eqx.nn.Embedding
      norm1: eqx.nn.LayerNorm
      attn: eqx.nn.MultiheadAttention
      norm2: eqx.nn.LayerNorm
      mlp: eqx.nn.MLP
      head: eqx.nn.Linear

      def __init__(self, key):
        keys = jax.random.split(key, 4)
        self.embed = eqx.nn.Embedding(vocab, width, key=keys[0])
        self.norm1, self.norm2 = eqx.nn.LayerNorm(width), eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(heads, width, key=keys[1])
        self.mlp = eqx.nn.MLP(width, width, hidden, 1, key=keys[2])
        self.head = eqx.nn.Linear(width, 3, key=keys[3])

      def __call__(self, ids):
        x = jax.vmap(self.embed)(ids)
        y = jax.vmap(self.norm1)(x)
        x = x + self.attn(y, y, y)
        x = x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))
        return self.head(x.mean(0))

    model = Block(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    return params, lambda p, ids: jax.vmap(eqx.combine(p, static))(ids)


@pytest.mark.slow
def test_vmapped_embedding_lookup_keeps_the_width():
  params, fn = EqxBlock.build()
  ids = jnp.arange(12).reshape(2, 6)
  graph = _trace(fn, params, ids, norms='exact')
  width = _group_of(graph, 'embed/weight', 1)
  assert width.prunable and width.kind == 'width' and width.size == 16
  assert width is _group_of(graph, 'head/weight', 1)
  plan = jps.make_plan(graph, {width.id: [0, 5, 9]})
  new_params, pruned_fn = jps.apply_plan(graph, params, plan)
  assert new_params.embed.weight.shape == (20, 13)
  assert jps.verify(graph, params, plan, ids).ok
  assert pruned_fn(new_params, ids).shape == (2, 3)


def eqx_lstm_text_model():
  """Embedding -> `eqx.nn.LSTMCell` scanned over the tokens -> Linear."""
  import equinox as eqx

  class Text(eqx.Module):
    embed: eqx.nn.Embedding
    cell: eqx.nn.LSTMCell
    head: eqx.nn.Linear

    def __init__(self, key):
      keys = jax.random.split(key, 3)
      self.embed = eqx.nn.Embedding(20, 8, key=keys[0])
      self.cell = eqx.nn.LSTMCell(8, 12, key=keys[1])
      self.head = eqx.nn.Linear(12, 3, key=keys[2])

    def __call__(self, ids):
      step = lambda carry, i: (self.cell(self.embed(i), carry), None)
      (h, _), _ = jax.lax.scan(step, (jnp.zeros(12), jnp.zeros(12)), ids)
      return self.head(h)

  params, static = eqx.partition(Text(jax.random.key(0)), eqx.is_array)
  return params, lambda p, ids: jax.vmap(eqx.combine(p, static))(ids)


def test_lstm_text_model_has_embedding_and_recurrent_groups():
  params, fn = eqx_lstm_text_model()
  graph = _trace(fn, params, jnp.arange(10).reshape(2, 5))
  prunable = graph.prunable_groups
  # By hand: the embedding width (read by weight_ih) and the 12 hidden units.
  assert sorted((g.size, g.kind) for g in prunable) == [(8, 'channels'), (12, 'recurrent')]
  hidden = _group_of(graph, 'cell/weight_hh', 1)
  # weight_ih stacks the 4 gates: hidden unit c owns rows c, c+12, c+24, c+36.
  (part,) = graph.leaf_axes['cell/weight_ih'][0]
  assert part.group_id == hidden.id
  assert part.indices.tolist()[:2] == [[0, 12, 24, 36], [1, 13, 25, 37]]
  recurrent = jps.select(graph, params, ratio={'recurrent': 0.25}, constraint=EXACT)
  assert {g: len(r) for g, r in recurrent.removed.items() if len(r)} == {hidden.id: 3}


def _rotate_every_two(x):
  """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...), as GPT-J and RoFormer write it."""
  return jnp.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)


def _rotary(x, form):
  n, d = x.shape[-3], x.shape[-1]
  angle = np.arange(n)[:, None] / 10000 ** (np.arange(0, d, 2) / d)[None]
  sin, cos = np.sin(angle)[:, None], np.cos(angle)[:, None]  # (positions, 1, d / 2)
  if form == 'pairs':  # each rotated pair written out, stacked back (CodeGen)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).reshape(x.shape)
  if form == 'gptj':  # the table's entries repeated, rotate_every_two
    sin, cos = jnp.asarray(sin).repeat(2, -1), jnp.asarray(cos).repeat(2, -1)
    return x * cos + _rotate_every_two(x) * sin
  if form == 'roformer':  # the table stacked with itself, multiplied in by einsum
    sin = jnp.stack([sin[:, 0], sin[:, 0]], axis=-1).reshape(n, d)
    cos = jnp.stack([cos[:, 0], cos[:, 0]], axis=-1).reshape(n, d)
    return jnp.einsum('bslh,sh->bslh', x, cos) + jnp.einsum(
      'bslh,sh->bslh', _rotate_every_two(x), sin
    )
  x1, x2 = x[..., : d // 2], x[..., d // 2 :]  # Llama: half-split
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class RotaryAttention(nn.Module):
  form: str

  @nn.compact
  def __call__(self, x):
    q, k, v = (nn.DenseGeneral((2, 8), name=name)(x) for name in 'qkv')
    q, k = _rotary(q, self.form), _rotary(k, self.form)
    probs = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k), -1)
    out = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), name='o')(out)


# Interleaved rotary embeddings rotate dims (2i, 2i + 1) of each head together,
# the half-split form dims (i, i + 4).
ROTATED = {
  'pairs': [[0, 1], [2, 3], [4, 5], [6, 7]],
  'gptj': [[0, 1], [2, 3], [4, 5], [6, 7]],
  'roformer': [[0, 1], [2, 3], [4, 5], [6, 7]],
  'llama': [[0, 4], [1, 5], [2, 6], [3, 7]],
}


@pytest.mark.parametrize('form', sorted(ROTATED))
def test_rotary_keeps_query_key_head_dim_in_rotated_pairs(form):
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  pairs = ROTATED[form]
  model = RotaryAttention(form)
  variables = model.init(jax.random.key(0), x)
  graph = _trace(model.apply, variables, x)
  # By hand: the 2 heads, the 4 rotated query/key pairs, the 8 value/output dims.
  kinds = sorted((g.kind, g.size) for g in graph.prunable_groups)
  assert kinds == [('head_dim', 4), ('head_dim', 8), ('heads', 2)], graph.summary()
  (part,) = graph.leaf_axes['params/q/kernel'][2]
  group = graph.groups[part.group_id]
  # A rotated pair is one channel.
  assert group.prunable and group.kind == 'head_dim' and part.indices.tolist() == pairs
  plan = jps.make_plan(graph, {group.id: [1]})
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  zeroed = jax.tree.map(np.array, variables)
  for name in 'qk':
    zeroed['params'][name]['kernel'][..., pairs[1]] = 0
    zeroed['params'][name]['bias'][..., pairs[1]] = 0
  assert new_variables['params']['q']['kernel'].shape == (16, 2, 6)
  np.testing.assert_allclose(
    pruned_fn(new_variables, x), model.apply(zeroed, x), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize('form', ['gptj', 'roformer'])
def test_prune_removes_interleaved_rotary_pairs_whole(form):
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  model = RotaryAttention(form)
  variables = model.init(jax.random.key(0), x)
  # `model.apply`, not the module: the module's own code would make its sin/cos
  # table for the pruned head size, not for the kept pairs.
  result = jps.prune(model.apply, variables, x, ratio=0.5, constraint=EXACT, progress=False)
  assert result.check.ok and result.flops_after < result.flops_before
  graph, removed = result.graph, result.plan.removed
  (heads,) = graph.leaf_axes['params/q/kernel'][1]
  (rotated,) = graph.leaf_axes['params/q/kernel'][2]
  (values,) = graph.leaf_axes['params/v/kernel'][2]
  gone = rotated.indices[removed[rotated.group_id]]
  assert len(gone) == 2 and (gone[:, 0] % 2 == 0).all() and (gone[:, 1] == gone[:, 0] + 1).all()
  # Half of the heads, of the rotated pairs and of the value dims go.
  assert result.variables['params']['q']['kernel'].shape == (16, 1, 4)
  assert result.variables['params']['v']['kernel'].shape == (16, 1, 4)
  # By hand: removed query/key dims add nothing to q.k, removed heads and value
  # dims nothing to the output projection.
  zeroed = jax.tree.map(np.array, variables)
  params = zeroed['params']
  for name in 'qk':
    params[name]['kernel'][..., gone.ravel()] = 0
    params[name]['bias'][..., gone.ravel()] = 0
  params['o']['kernel'][heads.indices[removed[heads.group_id]].ravel()] = 0
  params['o']['kernel'][:, values.indices[removed[values.group_id]].ravel()] = 0
  np.testing.assert_allclose(
    result.model(result.variables, x), model.apply(zeroed, x), rtol=1e-5, atol=1e-5
  )


class SigmoidMoE(nn.Module):
  """Four experts, each a 2-layer MLP, mixed by sigmoid gates."""

  @nn.compact
  def __call__(self, x):
    gates = jax.nn.sigmoid(nn.Dense(4, name='router')(x))
    w_in = self.param('w_in', nn.initializers.normal(), (4, x.shape[-1], 16))
    w_out = self.param('w_out', nn.initializers.normal(), (4, 16, x.shape[-1]))
    hidden = jax.nn.relu(jnp.einsum('btd,edf->btef', x, w_in))
    return jnp.einsum('bted,bte->btd', jnp.einsum('btef,efd->bted', hidden, w_out), gates)


def test_expert_axis_has_its_own_kind():
  model = SigmoidMoE()
  x = jax.random.normal(jax.random.key(1), (2, 3, 8))
  variables = model.init(jax.random.key(0), x)
  graph = _trace(model.apply, variables, x)
  experts = _group_of(graph, 'params/w_in', 0)
  assert experts.prunable and experts.kind == 'experts' and experts.size == 4
  assert _group_of(graph, 'params/w_in', 2).kind == 'channels'
  plan = jps.select(graph, variables, ratio={'experts': 0.5}, constraint=EXACT)
  assert {g: len(r) for g, r in plan.removed.items() if len(r)} == {experts.id: 2}
  assert not any(
    len(r)
    for r in jps.select(
      graph, variables, ratio={'head_dim': 0.5}, constraint=EXACT
    ).removed.values()
  )


def test_summary_names_the_weight_axes_a_rule_blocked():
  class Sorted(nn.Module):
    @nn.compact
    def __call__(self, x):
      hidden = nn.Dense(8, name='inner')(x)
      return nn.Dense(3, name='outer')(jnp.sort(hidden, axis=-1))

  x = jnp.ones((2, 4))
  variables = Sorted().init(jax.random.key(0), x)
  summary = _trace(Sorted().apply, variables, x).summary()
  # The 8 hidden units, on both sides of the sort, are lost to the sort.
  assert (
    'weight axes blocked by a rule: params/inner/kernel:1, params/inner/bias:0 '
    "(blocked by primitive 'sort'); params/outer/kernel:0 (blocked by primitive "
    "'sort')"
  ) in summary


def test_a_module_that_remakes_its_rotary_table_is_told_to_prune_its_apply():
  """The module's own code makes its sin/cos table for the pruned head size, which
  the trace held as a constant; the pruned callable matches, the module does not."""
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  model = RotaryAttention('gptj')
  variables = model.init(jax.random.key(0), x)
  with pytest.raises(RuntimeError, match=r'while the pruned callable matches it') as info:
    jps.prune(model, variables, x, ratio=0.5, constraint=EXACT, progress=False)
  assert 'prune(model.apply, variables, x)' in str(info.value)
  assert 'Please report' not in str(info.value)
