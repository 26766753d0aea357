"""The primitives JAX LLM code emits, and which of them the structured pass has no rule for.

Tiny two-layer decoders written the way MaxText (Flax Linen: `nn.scan` over `nn.remat`
layers, `checkpoint_name` on activations, logical sharding constraints on a mesh), Flax
NNX and penzai (its own `llamalike_common` modules, if `penzai` is installed) write them;
for each, the primitives of `jax.make_jaxpr` of the forward pass and of a training step
(`jax.grad` of a cross-entropy loss and an `optax.adamw` update), sub-jaxprs included.
The table in docs/guides/structured.md ("JAX LLM code") is this script's output.
About 15 s of CPU.

    python benchmarks/lm_primitives.py
"""

from __future__ import annotations

import dataclasses
import os
import sys

import flax.linen as nn
import jax
import optax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore

import jaxprune.structured as jps

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')
)

from structured_lm_primitives_test import (  # noqa: E402
  EMB,
  HEAD_DIM,
  HEADS,
  LAYERS,
  MESH,
  MLP,
  RULES,
  TOKENS,
  VOCAB,
  Decoder,
)


class NnxBlock(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.attn = nnx.MultiHeadAttention(
      HEADS, EMB, qkv_features=HEADS * HEAD_DIM, decode=False, rngs=rngs
    )
    self.norm1, self.norm2 = nnx.RMSNorm(EMB, rngs=rngs), nnx.RMSNorm(EMB, rngs=rngs)
    self.up = nnx.Linear(EMB, MLP, use_bias=False, rngs=rngs)
    self.down = nnx.Linear(MLP, EMB, use_bias=False, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm1(x), mask=nnx.make_causal_mask(x[..., 0]))
    return x + self.down(checkpoint_name(nnx.gelu(self.up(self.norm2(x))), 'mlp'))


class NnxDecoder(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, EMB, rngs=rngs)
    self.blocks = nnx.List([NnxBlock(rngs) for _ in range(LAYERS)])
    self.head = nnx.Linear(EMB, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = nnx.remat(lambda b, x: b(x))(block, x)
    return self.head(x)


def maxtext():
  model = Decoder()
  with nn.logical_axis_rules(RULES):
    variables = model.init(jax.random.key(0), TOKENS)

  def forward(v, tokens):
    with nn.logical_axis_rules(RULES):
      return model.apply(v, tokens)

  return forward, variables


def flax_nnx():
  graphdef, state = nnx.split(NnxDecoder(nnx.Rngs(0)))
  return (lambda s, tokens: nnx.merge(graphdef, s)(tokens)), state


def penzai(layer_stack: bool):
  from penzai import pz
  from penzai.models.transformer.variants import llamalike_common as llama

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
    use_layer_stack=layer_stack,
  )
  model = llama.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
  unbound, params = pz.unbind_params(model, freeze=True)

  def forward(values, tokens):
    bound = pz.bind_variables(
      unbound, [dataclasses.replace(p, value=values[p.label]) for p in params]
    )
    return bound(pz.nx.wrap(tokens, 'batch', 'seq')).unwrap('batch', 'seq', 'vocabulary')

  return forward, {p.label: p.value for p in params}


def train_step(forward, variables):
  tx = optax.adamw(1e-3)

  def step(v, opt_state, tokens):
    def loss(v):
      logits = forward(v, tokens)
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

    grads = jax.grad(loss)(v)
    updates, opt_state = tx.update(grads, opt_state, v)
    return optax.apply_updates(v, updates), opt_state

  return step, tx.init(variables)


def primitives(fn, *args) -> set[str]:
  found = set()

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      found.add(eqn.primitive.name)
      for sub in jcore.jaxprs_in_params(eqn.params):
        visit(getattr(sub, 'jaxpr', sub))

  visit(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def main() -> None:
  models = {'MaxText style': maxtext, 'Flax NNX': flax_nnx}
  try:
    import penzai as _  # noqa: F401

    models |= {'penzai': lambda: penzai(False), 'penzai layer stack': lambda: penzai(True)}
  except ImportError:
    print('penzai is not installed: pip install penzai to include it')
  with jax.set_mesh(MESH):
    for name, make in models.items():
      forward, variables = make()
      step, opt_state = train_step(forward, variables)
      seen = primitives(forward, variables, TOKENS)
      trained = primitives(step, variables, opt_state, TOKENS)
      no_rule = sorted(p for p in seen | trained if p not in jps.primitive_table())
      print(f'{name}\n  forward: {" ".join(sorted(seen))}')
      print(f'  training step adds: {" ".join(sorted(trained - seen))}')
      print(f'  no channel rule: {" ".join(no_rule)} (iota is a constant, never walked)')


if __name__ == '__main__':
  main()
