"""jaxprune.oneshot on whole models: the byte-level LM and HF Flax GPT-2 and Llama."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import thirdparty_zoo_hf as hf

import jaxprune
from benchmarks import charlm
from jaxprune import oneshot


def _nats(fn, params, batch):
  logits = fn(params, batch[:, :-1])
  return float(optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean())


def _check(params, new, masks, layers, sparsity):
  """Every named layer pruned to `sparsity` (zero where masked), all else untouched."""
  names = dict(jaxprune.named_leaves(params))
  new_leaves, mask_leaves = dict(jaxprune.named_leaves(new)), {}
  for path, mask in jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda x: x is None)[0]:
    mask_leaves[jaxprune.leaf_name(path)] = mask
  for name, leaf in names.items():
    mask = mask_leaves[name]
    if name in layers:
      assert mask is not None and mask.shape == leaf.shape, name
      assert float(np.mean(np.asarray(mask))) == pytest.approx(sparsity and 1 - sparsity), name
      assert np.all(np.asarray(new_leaves[name])[~np.asarray(mask)] == 0), name
    else:
      assert mask is None, name
      np.testing.assert_array_equal(np.asarray(new_leaves[name]), np.asarray(leaf))


@pytest.mark.slow
def test_charlm_layers_waves_and_three_methods():
  config = charlm.Config(layers=2, width=32, heads=2, hidden=64, seq_len=16)
  params, fn = charlm.init_params(config), charlm.apply_fn(config)
  rng = np.random.default_rng(0)
  batches = [jnp.asarray(rng.integers(0, 256, (4, 17)), jnp.int32) for _ in range(2)]
  closed = jax.make_jaxpr(fn)(params, batches[0][:, :-1])
  layers = oneshot.find_layers(closed, [name for name, _ in jaxprune.named_leaves(params)])
  waves = {layer.name: layer.wave for layer in layers}
  # q/k/v read the first norm; o reads attention; gate/up read the second norm; down
  # reads them; the next block starts after; the head last.
  assert waves == {
    f'block_{b}/{n}/kernel': 4 * b + w
    for b in range(2)
    for n, w in (('q', 0), ('k', 0), ('v', 0), ('o', 1), ('gate', 2), ('up', 2), ('down', 3))
  } | {'head/kernel': 8}
  blocks = {name for name in waves if name.startswith('block_')}
  dense = np.mean([_nats(fn, params, b) for b in batches])
  for method in oneshot.METHODS:
    new, masks = oneshot.prune(
      fn,
      params,
      [b[:, :-1] for b in batches],
      method=method,
      sparsity=0.5,
      overrides={'^head/': None},
    )
    _check(params, new, masks, blocks, 0.5)
    assert np.isfinite(np.mean([_nats(fn, new, b) for b in batches])) and np.isfinite(dense)


def _hf_case(name):
  case = hf.hf_gpt2() if name == 'gpt2' else hf.hf_llama()
  rng = np.random.default_rng(1)
  vocab = case.inputs(1)[0].max() + 1
  batches = [jnp.asarray(rng.integers(1, 64, (4, 8)) % vocab, jnp.int32) for _ in range(2)]
  return case, batches


# The layers, worked out from the models' code: GPT-2's Conv1D kernels (used transposed)
# and Llama's Dense kernels; embeddings (a lookup, and GPT-2's tied LM head) are not.
_GPT2 = {
  f'transformer/h/{i}/{m}/kernel'
  for i in range(2)
  for m in ('attn/c_attn', 'attn/c_proj', 'mlp/c_fc', 'mlp/c_proj')
}
_LLAMA = {
  f'model/layers/{i}/{m}/kernel'
  for i in range(2)
  for m in (
    'self_attn/q_proj',
    'self_attn/k_proj',
    'self_attn/v_proj',
    'self_attn/o_proj',
    'mlp/gate_proj',
    'mlp/up_proj',
    'mlp/down_proj',
  )
}


@pytest.mark.slow
@pytest.mark.parametrize('name', ['gpt2', 'llama'])
def test_hf_models_pruned_by_all_three_methods(name):
  case, batches = _hf_case(name)
  expected = _GPT2 if name == 'gpt2' else _LLAMA | {'lm_head/kernel'}
  closed = jax.make_jaxpr(case.fn)(case.variables, batches[0])
  found = oneshot.find_layers(closed, [n for n, _ in jaxprune.named_leaves(case.variables)])
  assert {layer.name for layer in found} == expected
  for method, target in (
    ('magnitude', dict(sparsity=0.5)),
    ('wanda', dict(nm='2:4')),
    ('sparsegpt', dict(sparsity=0.5)),
  ):
    new, masks = oneshot.prune(case.fn, case.variables, batches, method=method, **target)
    _check(case.variables, new, masks, expected, 0.5)
    assert np.all(np.isfinite(np.asarray(case.fn(new, batches[0]))))
  stripped = jaxprune._results.export.strip(new, masks)
  assert jax.tree.structure(stripped) == jax.tree.structure(case.variables)


@pytest.mark.parametrize('method', ['wanda', 'sparsegpt'])
def test_charlm_with_its_blocks_under_nn_scan_prunes_as_unrolled(method):
  """The byte LM with `Config.scan` (the blocks' params stacked, run by one `nn.scan`)
  gets the unrolled model's masks and params, slice by slice."""
  config = charlm.Config(layers=2, width=32, heads=2, hidden=64, seq_len=16)
  scanned = charlm.Config(layers=2, width=32, heads=2, hidden=64, seq_len=16, scan=True)
  params = charlm.init_params(config)
  rng = np.random.default_rng(0)
  batches = [jnp.asarray(rng.integers(0, 256, (4, 16)), jnp.int32) for _ in range(2)]
  target = dict(sparsity=0.5) if method == 'wanda' else dict(nm='2:4')
  new, masks = oneshot.prune(
    charlm.apply_fn(config), params, batches, method=method, overrides={'^head/': None}, **target
  )
  got, got_masks = oneshot.prune(
    charlm.apply_fn(scanned),
    charlm.stack_blocks(params, 2),
    batches,
    method=method,
    overrides={'^head/': None},
    **target,
  )
  for a, b in zip(
    jax.tree.leaves(got_masks), jax.tree.leaves(charlm.stack_blocks(masks, 2)), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(charlm.stack_blocks(new, 2)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(np.mean(np.asarray(got_masks['blocks']['q']['kernel']))) == 0.5
