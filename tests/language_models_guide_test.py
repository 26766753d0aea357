"""The language models guide (docs/guides/language_models.md) runs as written, section by
section, and its models end where each architecture says: every matmul weight (every
layer of a scanned stack) at exactly the target, embeddings and norms dense, the structured
shapes and the export sizes worked out by hand. The keras-hub block, shown but not run by
the docs build, runs here when keras-hub (the `lm` extra) is installed.
"""

import os
import re

os.environ.setdefault('KERAS_BACKEND', 'jax')

import numpy as np
import pytest
from docs_blocks import DOCS, code_cells

import jaxprune

PAGE = 'guides/language_models.md'
SECTIONS = [
  (None, '## MaxText'),
  ('## MaxText', '### One-shot'),
  ('### One-shot', '### Structured'),
  ('### Structured', '## Flax NNX'),
  ('## Flax NNX', '## penzai'),
  ('## penzai', '## gemma'),
  ('## gemma', '## keras-hub'),
  ('## Export', None),
]


def _run(scope, capsys, section):
  start, end = SECTIONS[section]
  for cell in code_cells(PAGE, start, end):
    exec(compile(cell, f'docs/{PAGE}', 'exec'), scope)  # noqa: S102 - the page's own code
  return capsys.readouterr().out.splitlines()


def _zeros_per_layer(leaf, axis):
  """The number of zeros in each layer of a stacked leaf, its layer axis `axis`."""
  zeros = np.moveaxis(np.asarray(leaf) == 0, axis, 0)
  return zeros.reshape(zeros.shape[0], -1).sum(axis=1).tolist()


def _check_gradual(params, opt_state, expected, stacked):
  """Each leaf in `expected` has exactly half its weights zero (each layer of a stacked
  one on its own, exact rule: round(n / 2) kept); every other leaf has no zero and no
  mask (random float weights are never exactly 0)."""
  masks = {name for name, _ in jaxprune.named_leaves(jaxprune.get_masks(opt_state))}
  assert masks == set(expected)
  for name, leaf in jaxprune.named_leaves(params):
    size = np.asarray(leaf).size
    if name in stacked:
      layers = np.asarray(leaf).shape[stacked[name]]
      assert _zeros_per_layer(leaf, stacked[name]) == [size // layers // 2] * layers, name
    elif name in expected:
      assert int((np.asarray(leaf) == 0).sum()) == size // 2, name
    else:
      assert not (np.asarray(leaf) == 0).any(), name


@pytest.mark.slow  # about 80 s of CPU: five models traced, trained, pruned three ways
def test_the_guide_prunes_each_library_s_model(capsys):
  scope = {}
  _run(scope, capsys, 0)

  # MaxText style: the 7 kernels of each layer, stacked on axis 1, and the LM head.
  out = _run(scope, capsys, 1)
  params = scope['params']
  layer = [
    *(f'layers/self_attention/{n}/kernel' for n in ('key', 'out', 'query', 'value')),
    *(f'layers/mlp/{n}/kernel' for n in ('wi_0', 'wi_1', 'wo')),
  ]
  assert set(scope['weights'].names) == {*layer, 'logits_dense/kernel'}
  assert scope['weights'].stacked_axes == dict.fromkeys(layer, 1)
  state, opt_state = scope['trained']['MaxText style']
  _check_gradual(state, opt_state, [*layer, 'logits_dense/kernel'], dict.fromkeys(layer, 1))
  thresholds = jaxprune.get_thresholds(opt_state)
  assert all(thresholds[name].shape == (3,) for name in layer)
  assert out[0] == '(32, 3, 64)'
  assert sum(line.endswith('per layer [0.5, 0.5, 0.5]') for line in out) == 7

  # One-shot SparseGPT 2:4: at most 2 nonzeros in each 4 consecutive inputs of every
  # output, each layer (the input axis of wi_0 and wi_1 is embed, axis 0; of wo, mlp).
  out = _run(scope, capsys, 2)
  pruned = scope['pruned']
  for name in ('wi_0', 'wi_1', 'wo'):
    kernel = np.moveaxis(np.asarray(pruned['layers']['mlp'][name]['kernel']), 1, 0)
    for per_layer in kernel:  # (inputs, outputs)
      groups = (per_layer != 0).reshape(-1, 4, per_layer.shape[-1]).sum(axis=1)
      assert (groups == 2).all(), name
  np.testing.assert_array_equal(
    pruned['token_embedder']['embedding'], params['token_embedder']['embedding']
  )
  assert 'wi_0 is 2:4 in every layer: True' in out
  assert "'token_embedder/embedding' (read by a gather" in out[0]

  # Structured, ratio 0.25: floor(0.25 * n) of each group goes: 16 of the 64 MLP
  # channels, 1 of the 4 heads, 2 of each head's 8 dims; the width stays 32.
  out = _run(scope, capsys, 3)
  small = scope['result'].variables['params']
  shapes = {name: np.shape(leaf) for name, leaf in jaxprune.named_leaves(small)}
  assert shapes['layers/mlp/wi_0/kernel'] == shapes['layers/mlp/wi_1/kernel'] == (32, 3, 48)
  assert shapes['layers/mlp/wo/kernel'] == (48, 3, 32)
  for name in ('query', 'key', 'value'):
    assert shapes[f'layers/self_attention/{name}/kernel'] == (32, 3, 3, 6)
  assert shapes['layers/self_attention/out/kernel'] == (3, 3, 6, 32)
  assert shapes['token_embedder/embedding'] == (128, 32)
  assert scope['result'].complete and scope['result'].check.ok
  assert out[-1] == '(32, 3, 48) (32, 3, 3, 6)'

  # Flax NNX: 6 kernels a block, unrolled; the tied embedding dense.
  out = _run(scope, capsys, 4)
  kernels = ('attn/key', 'attn/out', 'attn/query', 'attn/value', 'down', 'up')
  expected = [f'blocks/{i}/{k}/kernel' for i in (0, 1) for k in kernels]
  assert set(scope['nnx_weights'].names) == set(expected)
  _check_gradual(*scope['trained']['Flax NNX'], expected, {})
  # Wanda compares within each output row: each of up's 128 outputs keeps 16 of its 32.
  up = np.asarray(dict(jaxprune.named_leaves(scope['pruned']))['blocks/0/up/kernel'])
  assert ((up == 0).sum(axis=0) == 16).all()
  # In place, ratio 0.25: 32 of the MLP's 128, 1 of 4 heads, 2 of 8 head dims.
  assert out[-1] == '96 3 6'
  assert out[0] == 'read by a gather, as an embedding lookup is, and elsewhere as a matmul weight'

  # penzai: a LayerStack (layer axis 0) of 7 weights, an untied LM head.
  out = _run(scope, capsys, 5)
  linears = [
    *(f'attention/{n}' for n in ('key', 'output', 'query', 'value')),
    *(f'mlp/{n}' for n in ('gating_linear', 'out_linear', 'value_linear')),
  ]
  stacked = {f'transformer/blocks/{n}.weights/value/data_array': 0 for n in linears}
  head = 'transformer/lm_head.weights/value/data_array'
  assert set(scope['pz_weights'].names) == {*stacked, head}
  _check_gradual(*scope['trained']['penzai'], [*stacked, head], stacked)
  assert 'value_linear, per layer: [0.5, 0.5]' in out

  # gemma's layout: the default regex misses all 10 einsum weights; matmul_weights finds them.
  out = _run(scope, capsys, 6)
  einsums = ('attn/q_einsum/w', 'attn/kv_einsum/w', 'attn/attn_vec_einsum/w')
  einsums += ('mlp/gating_einsum', 'mlp/linear')
  expected = [f'layer_{i}/{n}' for i in (0, 1) for n in einsums]
  # The default regex, (kernel|embedding)$, matches the tied table alone.
  assert out[0] == "the default regex matches ['embedder/input_embedding']"
  assert set(scope['gemma_weights'].names) == set(expected)
  tied = scope['gemma_weights'].reasons['embedder/input_embedding']
  assert tied.endswith('and elsewhere as a matmul weight')
  _check_gradual(*scope['trained']['gemma layout'], expected, {})

  # Export: dense float32 bytes; a masked leaf as BCOO holds half its values, each with
  # one int32 index per axis: n/2 * (4 + 4 * ndim) bytes.
  out = _run(scope, capsys, 7)
  for library, line in zip(scope['trained'], out, strict=False):
    state, opt_state = scope['trained'][library]
    masked = {name for name, _ in jaxprune.named_leaves(jaxprune.get_masks(opt_state))}
    dense = bcoo = 0
    for name, leaf in jaxprune.named_leaves(state):
      leaf = np.asarray(leaf)
      dense += 4 * leaf.size
      bcoo += leaf.size // 2 * (4 + 4 * leaf.ndim) if name in masked else 4 * leaf.size
    numbers = [int(n.replace(',', '')) for n in re.findall(r'(\d[\d,]*) B', line)]
    assert line.startswith(library) and numbers[:2] == [dense, bcoo], line
  assert out[-1] == f'BCOO (32, 3, 64) {32 * 3 * 64 // 2}'


@pytest.mark.slow
def test_the_keras_hub_block_prunes_llama(capsys):
  keras = pytest.importorskip('keras')
  pytest.importorskip('keras_hub', reason='keras-hub is in the lm extra: pip install -e ".[lm]"')
  if keras.backend.backend() != 'jax':
    pytest.skip(f'keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax')
  with open(os.path.join(DOCS, PAGE)) as f:
    section = f.read().split('## keras-hub', 1)[1]
  code = re.search(r'```python\n(.*?)```', section, flags=re.DOTALL).group(1)
  scope = {}
  _run(scope, capsys, 0)
  exec(compile(code, f'docs/{PAGE}', 'exec'), scope)  # noqa: S102 - the page's own code
  out = capsys.readouterr().out
  layer = [
    *(f'self_attention/{n}/kernel' for n in ('query', 'key', 'value', 'attention_output')),
    *(f'feedforward_{n}_dense/kernel' for n in ('intermediate', 'gate', 'output')),
  ]
  expected = [f'transformer_layer_{i}/{n}' for i in (0, 1) for n in layer]
  expected.append('token_embedding/reverse_embeddings')
  assert set(scope['keras_weights'].names) == set(expected)
  _check_gradual(scope['state'], scope['opt_state'], expected, {})
  # The keras model holds the pruned values; SparseGPT left the embedding dense.
  for variable in scope['variables']:
    np.testing.assert_array_equal(variable.value, scope['state'][variable.path])
  assert "'token_embedding/embeddings' (read by a gather" in out
  pruned = scope['pruned']
  assert float(jaxprune.get_weight_sparsity(pruned)['token_embedding/reverse_embeddings']) == 0.5
