"""Width pruning through norms (`trace(norms=...)`): hand-made norms checked
against numpy written out here, and the HF Flax transformers of the zoo."""

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import thirdparty_zoo_hf as hf
from docs_blocks import code_cells

import jaxprune.structured as jps
from jaxprune.structured._shrink import verify as oracle

EXACT = jps.Constraint(round_to=1)
APPROX = jps.Constraint(round_to=1, allow_approximate=True)

D, N_IN, N_OUT, HIDDEN, EPS = 8, 6, 3, 12, 1e-6


def _params(seed=0):
  rng = np.random.default_rng(seed)
  draw = lambda *shape: jnp.asarray(rng.normal(size=shape).astype(np.float32))
  return {
    'embed': draw(N_IN, D),
    'scale': draw(D),
    'bias': draw(D),
    'up': draw(D, HIDDEN),
    'head': draw(HIDDEN, N_OUT),
  }


def _rms(p, x):
  h = x @ p['embed']
  n = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + EPS) * p['scale']
  return jax.nn.relu(n @ p['up']) @ p['head']


def _ln_fast(p, x):  # E[x^2] - E[x]^2, as flax.linen.LayerNorm by default
  h = x @ p['embed']
  mean = jnp.mean(h, -1, keepdims=True)
  var = jnp.mean(h * h, -1, keepdims=True) - mean * mean
  n = (h - mean) * jax.lax.rsqrt(var + EPS) * p['scale'] + p['bias']
  return jax.nn.relu(n @ p['up']) @ p['head']


def _ln_two_pass(p, x):  # E[(x - E[x])^2]: not zero at removed channels
  h = x @ p['embed']
  mean = jnp.mean(h, -1, keepdims=True)
  var = jnp.mean((h - mean) ** 2, -1, keepdims=True)
  n = (h - mean) * jax.lax.rsqrt(var + EPS) * p['scale'] + p['bias']
  return jax.nn.relu(n @ p['up']) @ p['head']


def _x(batch=4, seed=1):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, N_IN)).astype(np.float32))


def _numpy_norm(p, x, kept, divisor, layer_norm):
  """The pruned model written out in float64 on the kept channels only."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  h = np.asarray(x, np.float64) @ p['embed'][:, kept]
  if layer_norm:
    mean = h.sum(-1, keepdims=True) / divisor
    var = (h * h).sum(-1, keepdims=True) / divisor - mean * mean
    n = (h - mean) / np.sqrt(var + EPS) * p['scale'][kept] + p['bias'][kept]
  else:
    n = h / np.sqrt((h * h).sum(-1, keepdims=True) / divisor + EPS) * p['scale'][kept]
  return np.maximum(n @ p['up'][kept], 0) @ p['head']


def _width(graph):
  width = [g for g in graph.groups if g.kind == 'width']
  assert len(width) == 1
  return width[0]


@pytest.mark.parametrize('fn,layer_norm', [(_rms, False), (_ln_fast, True)])
@pytest.mark.parametrize('norms', ['exact', 'renormalise'])
def test_pruned_norm_divides_by_the_full_or_the_kept_width(fn, layer_norm, norms):
  p, x = _params(), _x()
  graph = jps.trace(fn, p, x, norms=norms)
  width = _width(graph)
  assert width.size == D and width.prunable
  assert width.approximate == (norms == 'renormalise')
  removed = np.array([1, 4, 6])
  kept = np.setdiff1d(np.arange(D), removed)
  new, pruned_fn = jps.apply_plan(graph, p, {width.id: removed})
  assert new['embed'].shape == (N_IN, 5) and new['scale'].shape == (5,)
  assert new['up'].shape == (5, HIDDEN) and new['head'].shape == (HIDDEN, N_OUT)
  divisor = D if norms == 'exact' else len(kept)
  want = _numpy_norm(p, x, kept, divisor, layer_norm)
  np.testing.assert_allclose(pruned_fn(new, x), want, rtol=2e-4, atol=2e-4)


def test_two_pass_layer_norm_is_approximate_even_when_exact_is_asked():
  p, x = _params(), _x()
  assert _width(jps.trace(_ln_two_pass, p, x, norms='exact')).approximate
  assert not _width(jps.trace(_ln_fast, p, x, norms='exact')).approximate


def test_default_trace_leaves_the_width_blocked():
  p, x = _params(), _x()
  graph = jps.trace(_rms, p, x)
  assert graph.norms is None and not graph.approximate_groups
  assert [(g.size, g.kind) for g in graph.prunable_groups] == [(HIDDEN, 'channels')]
  stream = [g for g in graph.groups if any(m.leaf == 'scale' for m in g.members)]
  assert 'reduced over' in stream[0].reason and not stream[0].prunable
  assert 'kind' not in graph.summary()


def test_bad_norms_option_names_the_choices():
  with pytest.raises(ValueError, match="norms='layernorm'.*'exact'.*'renormalise'"):
    jps.trace(_rms, _params(), _x(), norms='layernorm')


def test_approximate_groups_are_left_whole_unless_asked_for():
  p, x = _params(), _x()
  graph = jps.trace(_ln_two_pass, p, x, norms='exact')
  width = _width(graph)
  mlp = [g for g in graph.prunable_groups if g.kind == 'channels'][0]
  for kwargs in (
    dict(ratio=0.5),
    dict(ratio=0.5, scope='global'),
    dict(flops_target=0.3),
    dict(ratio={'width': 0.5}),
  ):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # 0.3 of the FLOPs cannot be reached without the width
      plan = jps.select(graph, p, constraint=EXACT, **kwargs)
    assert width.id not in plan.removed, kwargs
  plan = jps.select(graph, p, ratio=0.5, constraint=APPROX)
  assert len(plan.removed[width.id]) == 4 and len(plan.removed[mlp.id]) == 6
  report = jps.verify(graph, p, plan, x)
  assert report.ok and report.approximate == (width.id,)
  assert report.bound == jps.APPROXIMATE_RTOL and report.frozen_rel_diff < 1e-5
  assert report.max_rel_diff > 1e-3  # the statistics did change
  assert (
    f'approximate (selected only with Constraint(allow_approximate=True)): [{width.id}]'
    in graph.summary()
  )


def test_frozen_statistics_catch_a_wrong_channel_mapping(monkeypatch):
  p, x = _params(), _x()
  graph = jps.trace(_ln_two_pass, p, x, norms='exact')
  plan = jps.make_plan(graph, {_width(graph).id: [0, 3]})
  shrink = oracle.shrink_variables

  def mixed_up(graph, variables, plan):  # a shrink that mixed up the kept channels
    new = shrink(graph, variables, plan)
    return dict(new, scale=new['scale'][::-1])

  monkeypatch.setattr(oracle, 'shrink_variables', mixed_up)
  # A loose bound lets the outputs through; the frozen statistics do not.
  report = jps.verify(graph, p, plan, x, approximate_rtol=10.0)
  assert not report.ok and report.frozen_rel_diff > 1e-2 and report.max_rel_diff < 10.0


def test_activation_importance_is_mean_abs_activation_where_a_weight_reads_it():
  p = _params()
  batches = [_x(seed=s) for s in (1, 2, 3)]
  graph = jps.trace(_rms, p, batches[0], norms='exact')
  scores = jps.activation_importance(graph, p, batches)
  width = _width(graph)
  mlp = [g for g in graph.prunable_groups if g.kind == 'channels'][0]
  q = {k: np.asarray(v, np.float64) for k, v in p.items()}
  norm_out, hidden = [], []
  for x in batches:
    h = np.asarray(x, np.float64) @ q['embed']
    n = h / np.sqrt((h * h).mean(-1, keepdims=True) + EPS) * q['scale']
    norm_out.append(np.abs(n).mean(0))
    hidden.append(np.abs(np.maximum(n @ q['up'], 0)).mean(0))
  for gid, per_batch in ((width.id, norm_out), (mlp.id, hidden)):
    want = np.mean(per_batch, 0)
    np.testing.assert_allclose(scores[gid], want / want.mean(), rtol=1e-4)


def test_activation_importance_wants_the_traced_shapes():
  p = _params()
  graph = jps.trace(_rms, p, _x(), norms='exact')
  with pytest.raises(ValueError, match=r'batches\[0\].*float32\[4, 6\]'):
    jps.activation_importance(graph, p, [_x(batch=3)])
  with pytest.raises(ValueError, match='at least one calibration batch'):
    jps.activation_importance(graph, p, [])


# --- HF Flax transformers (tests/thirdparty_zoo_hf.py) ---


def _hf_trace(builder, norms):
  case = builder()
  args = case.inputs(2)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    return case, args, jps.trace(case.fn, case.variables, *args, norms=norms)


@pytest.fixture(scope='module')
def llama():
  return _hf_trace(hf.hf_llama, 'exact')


def test_llama_rmsnorm_width_passes_the_exact_oracle(llama):
  case, args, graph = llama
  width = _width(graph)
  assert width.size == 32 and not width.approximate
  leaves = {m.leaf for m in width.members}
  # The stream runs from the token embedding through every RMSNorm to the final norm and LM head.
  assert {
    'model/embed_tokens/embedding',
    'model/norm/weight',
    'lm_head/kernel',
    'model/layers/1/input_layernorm/weight',
    'model/layers/1/mlp/down_proj/kernel',
  } <= leaves
  # The hand count of tests/thirdparty_zoo_hf.py plus the width.
  assert len(graph.prunable_groups) == case.prunable + 1
  kinds = [g.kind for g in graph.prunable_groups]
  assert (kinds.count('heads'), kinds.count('head_dim'), kinds.count('channels')) == (4, 4, 2)
  plan = jps.select(graph, case.variables, ratio={'width': 0.25}, constraint=EXACT)
  assert list(plan.removed) == [width.id] and len(plan.removed[width.id]) == 8
  new, _ = jps.apply_plan(graph, case.variables, plan)
  assert new['model']['embed_tokens']['embedding'].shape == (hf.VOCAB, 24)
  assert new['lm_head']['kernel'].shape == (24, hf.VOCAB)
  report = jps.verify(graph, case.variables, plan, *args)
  assert report.ok and report.approximate == () and report.max_rel_diff < 1e-5


def test_per_kind_ratios_and_one_flops_target_on_llama(llama):
  case, _, graph = llama
  sizes = {g.id: (g.kind, g.size) for g in graph.prunable_groups}
  plan = jps.select(graph, case.variables, ratio={'heads': 0.5, 'channels': 0.25}, constraint=EXACT)
  # heads groups: 2 key/value heads and 2 query heads per key/value head -> 1 each;
  # MLP 64 -> 16; width and head_dim untouched.
  assert {gid: len(r) for gid, r in plan.removed.items()} == {
    gid: (1 if kind == 'heads' else 16)
    for gid, (kind, _) in sizes.items()
    if kind in ('heads', 'channels')
  }
  dense = jps.plan_flops(graph, jps.make_plan(graph, {}))
  plan = jps.select(graph, case.variables, flops_target=0.4, constraint=EXACT)
  assert jps.plan_flops(graph, plan) <= 0.4 * dense
  assert {sizes[gid][0] for gid in plan.removed} >= {'width', 'channels'}
  with pytest.raises(ValueError, match=r"ratio\['depth'\]: unknown kind"):
    jps.select(graph, case.variables, ratio={'depth': 0.3})
  with pytest.raises(ValueError, match="per kind works with scope='uniform'"):
    jps.select(graph, case.variables, ratio={'width': 0.3}, scope='global')


@pytest.mark.slow
def test_vit_renormalised_width_slices_cls_token_and_positions():
  case, args, graph = _hf_trace(hf.hf_vit, 'renormalise')
  width = _width(graph)
  assert width.approximate
  assert {
    'vit/embeddings/cls_token',
    'vit/embeddings/position_embeddings',
    'vit/layernorm/scale',
    'classifier/kernel',
  } <= {m.leaf for m in width.members}
  assert width.id not in jps.select(graph, case.variables, ratio=0.3, constraint=EXACT).removed
  plan = jps.select(graph, case.variables, ratio=0.3, constraint=APPROX)
  new, _ = jps.apply_plan(graph, case.variables, plan)
  # 32 - floor(0.3 * 32) = 23: a ratio is never exceeded.
  assert new['vit']['embeddings']['cls_token'].shape == (1, 1, 23)
  report = jps.verify(graph, case.variables, plan, *args)
  assert report.ok and report.approximate == (width.id,) and report.frozen_rel_diff < 1e-4


@pytest.mark.slow
def test_docs_width_example_runs_as_written():
  blocks = code_cells('guides/width.md')
  assert len(blocks) == 1
  namespace, out = {}, io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(blocks[0], 'docs/guides/width.md', 'exec'), namespace)  # noqa: S102
  # MLP 128 and width 64; 64 - 16 = 48 kept; group 1 approximate.
  assert out.getvalue().splitlines() == [
    "[(128, 'channels', False), (64, 'width', False)]",
    '(100, 48)',
    '(1,) True',
  ]


@pytest.mark.slow
def test_prune_takes_the_norms_option():
  """The one-call API: a Linen block with a residual stream through LayerNorm."""
  import flax.linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.Dense(16)(x)
      h = h + nn.Dense(16)(nn.relu(nn.Dense(32)(nn.LayerNorm()(h))))
      return nn.Dense(3)(nn.LayerNorm()(h))

  x = _x(4)
  variables = Block().init(jax.random.key(0), x)
  stream = lambda result: result.variables['params']['Dense_0']['kernel'].shape[1]
  kept = jps.prune(Block(), x, variables=variables, ratio=0.5, constraint=APPROX, progress=False)
  assert stream(kept) == 16  # the residual stream stays whole by default
  cut = jps.prune(
    Block(),
    x,
    variables=variables,
    ratio=0.5,
    constraint=APPROX,
    norms='renormalise',
    progress=False,
  )
  assert stream(cut) == 8
  assert cut.variables['params']['LayerNorm_0']['scale'].shape == (8,)
  assert cut.variables['params']['Dense_3']['kernel'].shape == (8, 3)
  assert cut.model_check.approximate and cut.model_check.ok
  with pytest.raises(ValueError, match="norms='exact'.*norms='renormalise'"):
    jps.prune(Block(), x, variables=variables, ratio=0.5, norms='exact', progress=False)
