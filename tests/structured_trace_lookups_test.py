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
    blocks = lambda t: t.reshape(b, n // self.block, self.block, self.heads,
                                 self.head_dim).transpose(0, 3, 1, 2, 4)
    look = jax.vmap(jax.vmap(lambda t, i: t[i]))
    keys, values = look(blocks(k), table), look(blocks(v), table)
    scores = jnp.einsum('bhnqk,bhnrsk->bhnqrs', blocks(q), keys)
    probs = jax.nn.softmax(scores.reshape(*scores.shape[:4], -1), -1).reshape(scores.shape)
    out = jnp.einsum('bhnqrs,bhnrsk->bhnqk', probs, values)
    out = out.transpose(0, 2, 3, 1, 4).reshape(b, n, self.heads, self.head_dim)
    return nn.DenseGeneral(d, axis=(-2, -1), name='o')(out)


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
  np.testing.assert_allclose(pruned_fn(new_variables, x), model.apply(zeroed, x),
                             rtol=1e-5, atol=1e-5)
  # At another batch and another sequence length too (the table is re-drawn).
  x2 = jax.random.normal(jax.random.key(2), (3, 24, 8))
  np.testing.assert_allclose(pruned_fn(new_variables, x2), model.apply(zeroed, x2),
                             rtol=1e-5, atol=1e-5)


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
