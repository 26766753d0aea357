"""Flax paths: Linen rebuild and resize, NNX in place, BatchNorm re-calibration, `prune`."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from structured_zoo import CNN, ZOO, TransformerBlock, _x

from jaxprune.structured import Calibration, Constraint, LinenOptions, make_plan, trace
from jaxprune.structured._prune import pipeline as api
from jaxprune.structured._select import selectors
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import calibrate, flax_rebuild
from jaxprune.structured._shrink import verify as oracle

# Exact counts: no rounding of the kept channels (also the default).
EXACT = Constraint(round_to=1)


class WidthCNN(nn.Module):
  """The zoo CNN with its widths as attributes, so it can be rebuilt smaller."""

  widths: tuple[int, int] = (8, 16)

  @nn.compact
  def __call__(self, x):
    norm = lambda name: nn.BatchNorm(use_running_average=True, name=name)
    x = nn.relu(norm('bn1')(nn.Conv(self.widths[0], (3, 3), name='conv1')(x)))
    x = nn.relu(norm('bn2')(nn.Conv(self.widths[1], (3, 3), strides=2, name='conv2')(x)))
    return nn.Dense(5, name='head')(jnp.mean(x, axis=(1, 2)))


def _perturbed(variables):
  """Random BatchNorm statistics and scales, so that removing a channel is not a no-op."""
  rng = np.random.default_rng(7)
  return jax.tree.map(
    lambda a: jnp.abs(a + 0.3 * rng.standard_normal(a.shape, np.float32)), variables
  )


def test_linen_rebuild_with_new_features_and_eval_shape_check():
  x = _x(2, 8, 8, 3)
  model = WidthCNN()
  variables = _perturbed(model.init(jax.random.key(0), x))
  graph = trace(model.apply, variables, x)
  plan = selectors.select(graph, variables, ratio=0.5, importance='bn_scale', constraint=EXACT)
  new, _ = shrink.apply_plan(graph, variables, plan)
  sizes = flax_rebuild.linen_feature_sizes(new)
  assert sizes == {'conv1': 4, 'conv2': 8, 'head': 5}
  rebuilt = WidthCNN(widths=(sizes['conv1'], sizes['conv2']))
  flax_rebuild.check_linen_shapes(rebuilt, new, x)
  reference = oracle.dense_reference(graph, variables, plan, x)
  assert oracle.compare(reference, rebuilt.apply(new, x))
  with pytest.raises(ValueError, match=r'params/conv2/kernel: model makes \(3, 3, 4, 16\)'):
    flax_rebuild.check_linen_shapes(WidthCNN(widths=(4, 16)), new, x)


def test_linen_resized_runs_the_unchanged_module():
  x = _x(2, 8, 8, 3)
  model = CNN()
  variables = _perturbed(model.init(jax.random.key(0), x))
  graph = trace(model.apply, variables, x)
  plan = selectors.select(graph, variables, ratio=0.5, constraint=EXACT)
  new, pruned_fn = shrink.apply_plan(graph, variables, plan)
  with pytest.raises(Exception, match='conv1'):
    model.apply(new, x)
  # dense_reference multiplies at full float32 precision: so does the run compared with it.
  with flax_rebuild.linen_resized(new), jax.default_matmul_precision('highest'):
    out = model.apply(new, x)
  assert oracle.compare(oracle.dense_reference(graph, variables, plan, x), out)
  np.testing.assert_allclose(out, pruned_fn(new, x), rtol=1e-5, atol=1e-6)


def test_linen_resized_attention_heads_and_mlp():
  fn, variables, (x,), _ = ZOO['transformer_block']()
  graph = trace(fn, variables, x)
  heads = next(
    g.id
    for g in graph.groups
    if any(m.leaf == 'params/attn/query/kernel' and m.axis == 1 for m in g.members)
  )
  mlp = next(
    g.id
    for g in graph.groups
    if any(m.leaf == 'params/mlp_in/kernel' and m.axis == 1 for m in g.members)
  )
  # head_dim is left alone: Flax recomputes 1/sqrt(head_dim), the traced jaxpr does not.
  plan = make_plan(graph, {heads: [1], mlp: [0, 5, 7]})
  new, _ = shrink.apply_plan(graph, variables, plan)
  assert new['params']['attn']['out']['kernel'].shape == (1, 4, 6)
  with flax_rebuild.linen_resized(new), jax.default_matmul_precision('highest'):
    out = TransformerBlock().apply(new, x)
  assert oracle.compare(oracle.dense_reference(graph, variables, plan, x), out)


def test_nnx_update_in_place_sets_attributes():
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
      self.bn = nnx.BatchNorm(8, rngs=rngs)
      self.dw = nnx.Conv(8, 8, (3, 3), feature_group_count=8, rngs=rngs)
      self.fc = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):
      x = self.dw(nnx.relu(self.bn(self.conv(x))))
      return self.fc(x.mean((1, 2)))

  model = Net(nnx.Rngs(0))
  model.eval()
  x = _x(2, 5, 5, 3)
  graphdef, state = nnx.split(model)
  graph = trace(lambda s, x: nnx.merge(graphdef, s)(x), state, x)
  plan = selectors.select(graph, state, ratio=0.25, constraint=EXACT)
  new, _ = shrink.apply_plan(graph, state, plan)
  reference = oracle.dense_reference(graph, state, plan, x)
  flax_rebuild.update_nnx(model, new)
  assert (model.conv.out_features, model.bn.num_features) == (6, 6)
  assert (model.dw.in_features, model.dw.out_features, model.dw.feature_group_count) == (6, 6, 6)
  assert (model.fc.in_features, model.fc.out_features) == (6, 4)
  assert oracle.compare(reference, model(x))


class _DenseBN(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Dense(3, name='fc')(x)
    return nn.BatchNorm(use_running_average=not train, momentum=0.8, name='bn')(x)


def test_recalibrate_gives_the_mean_of_batch_statistics_for_any_momentum():
  model = _DenseBN()
  batches = [jax.random.normal(jax.random.key(i), (16, 4)) * (i + 1) for i in range(3)]
  variables = model.init(jax.random.key(0), batches[0])
  update = calibrate.linen_update_fn(model, variables, train=True)
  stats = calibrate.recalibrate(update, variables['batch_stats'], batches)
  w = np.asarray(variables['params']['fc']['kernel'])
  b = np.asarray(variables['params']['fc']['bias'])
  acts = [np.asarray(x) @ w + b for x in batches]
  np.testing.assert_allclose(
    stats['bn']['mean'], np.mean([a.mean(0) for a in acts], 0), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    stats['bn']['var'], np.mean([a.var(0) for a in acts], 0), rtol=1e-4, atol=1e-5
  )
  with pytest.raises(ValueError, match='at least one calibration batch'):
    calibrate.recalibrate(update, variables['batch_stats'], [])


@pytest.mark.slow
def test_prune_one_line_linen_with_taylor_and_bn_recalibration():
  x = _x(4, 8, 8, 3)
  model = CNN()
  variables = model.init(jax.random.key(0), x)
  batches = [(_x(4, 8, 8, 3) * (i + 1), jnp.arange(4) % 5) for i in range(2)]
  loss = lambda out, batch: optax.softmax_cross_entropy_with_integer_labels(out, batch[1]).mean()
  result = api.prune(
    model,
    x,
    variables=variables,
    ratio=0.5,
    constraint=EXACT,
    importance='taylor',
    calibration=Calibration(batches, loss_fn=loss, recalibrate_bn=True),
    linen=LinenOptions(train_model=CNN(train=True), train_kwargs={}),
    progress=False,
  )
  assert result.check.ok
  # conv1 8 -> 4 and conv2 16 -> 8 channels: 2*36*(4*27) + 2*16*(9*4*8) + 2*8*5 FLOPs (4 images).
  dense = 4 * (2 * 64 * 27 * 8 + 2 * 16 * 72 * 16 + 2 * 16 * 5)
  pruned = 4 * (2 * 64 * 27 * 4 + 2 * 16 * 36 * 8 + 2 * 8 * 5)
  assert (result.flops_before, result.flops_after) == (dense, pruned)
  acts = [
    np.asarray(nn.Conv(4, (3, 3)).apply({'params': result.variables['params']['conv1']}, b[0]))
    for b in batches
  ]
  np.testing.assert_allclose(
    result.variables['batch_stats']['bn1']['mean'],
    np.mean([a.mean((0, 1, 2)) for a in acts], 0),
    rtol=1e-4,
    atol=1e-5,
  )
  assert result.apply(result.variables, x).shape == (4, 5)


def test_prune_one_line_nnx_to_a_flops_target():
  fn, state, (x,), _ = ZOO['nnx_model']()
  from structured_zoo import NNXNet

  model = NNXNet(nnx.Rngs(0))
  model.eval()
  result = api.prune(model, x, flops_target=0.6, constraint=EXACT, progress=False)
  # fc1 5 -> h, fc2 h -> 3 on 2 rows: 2*2*(5h + 3h) <= 0.6 * 2*2*(5*7 + 3*7) needs h <= 4.
  assert model.fc1.out_features == 4 and model.bn.num_features == 4
  assert result.flops_after == 2 * 2 * 8 * 4
  assert model(x).shape == (2, 3)
  with pytest.raises(ValueError, match='variables=...'):
    api.prune(model, x, variables={}, ratio=0.5)


@pytest.mark.slow
def test_prune_keeps_the_attention_scale_when_head_dim_is_pruned():
  fn, variables, (x,), _ = ZOO['transformer_block']()
  result = api.prune(
    TransformerBlock(), x, variables=variables, ratio=0.5, constraint=EXACT, progress=False
  )
  # query/key head_dim 4 -> 2 and value head_dim 4 -> 2, heads 2 -> 1.
  assert result.variables['params']['attn']['query']['kernel'].shape == (6, 1, 2)
  reference = oracle.dense_reference(result.graph, variables, result.plan, x)
  scale = float(np.abs(reference).max())
  # Flax recomputes 1/sqrt(head_dim); result.apply keeps the dense model's scale.
  np.testing.assert_allclose(result.apply(result.variables, x), reference, atol=1e-5 * scale)
  assert result.model_check.ok and result.model_check.max_rel_diff < 1e-5


class _Attention(nnx.Module):
  def __init__(self, rngs, attention_fn=nnx.dot_product_attention):
    self.attn = nnx.MultiHeadAttention(
      num_heads=2, in_features=6, qkv_features=8, decode=False, attention_fn=attention_fn, rngs=rngs
    )
    self.fc = nnx.Linear(6, 3, rngs=rngs)

  def __call__(self, x):
    return self.fc(self.attn(x))


@pytest.mark.slow
def test_prune_nnx_attention_keeps_its_scale_and_a_custom_one_is_refused_unchanged():
  x = _x(2, 5, 6)
  model = _Attention(nnx.Rngs(0))
  graphdef, state = nnx.split(nnx.clone(model))  # prune changes the model's own arrays
  graph = trace(lambda s, x: nnx.merge(graphdef, s)(x), state, x)
  result = api.prune(model, x, ratio=0.5, constraint=EXACT, progress=False)
  assert model.attn.head_dim == 2
  reference = oracle.dense_reference(graph, state, result.plan, x)
  np.testing.assert_allclose(model(x), reference, atol=1e-5 * float(np.abs(reference).max()))
  custom = _Attention(
    nnx.Rngs(0), attention_fn=lambda q, k, v, **kw: nnx.dot_product_attention(q, k, v, **kw)
  )
  before = jax.tree.map(np.asarray, nnx.state(custom))
  with pytest.raises(ValueError, match='head_dim was pruned from 4 to 2'):
    api.prune(custom, x, ratio=0.5, constraint=EXACT, progress=False)
  assert custom.attn.head_dim == 4
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.state(custom)))


@pytest.mark.parametrize(
  'kwargs, error, match',
  [
    (
      dict(ratio=0.5, calibration=Calibration(None, recalibrate_bn=True)),
      ValueError,
      'needs calibration batches',
    ),
    (dict(ratio=0.5, importance='taylor'), ValueError, 'pass loss_fn'),
    (dict(ratio=0.5, importance='l3'), ValueError, "importance='l3'"),
    (dict(ratio=1.5), ValueError, 'ratio=1.5'),
    (dict(ratio=0.5, scope='layer'), ValueError, "scope='layer'"),
    (dict(ratio=0.5, flops_target=0.5), ValueError, 'exactly one of'),
    (dict(ratio=0.5, constraint={'round_to': 8}), TypeError, 'give a jaxprune.structured'),
    (
      dict(ratio=0.5, calibration=Calibration([], inputs='x')),
      TypeError,
      'inputs must map a batch',
    ),
    (
      dict(ratio=0.5, calibration=Calibration([], recalibrate_bn=True)),
      ValueError,
      'needs calibration batches',
    ),
  ],
)
def test_prune_checks_every_argument_before_changing_the_model(kwargs, error, match):
  from structured_zoo import NNXNet

  model = NNXNet(nnx.Rngs(0))
  model.eval()
  before = jax.tree.map(np.asarray, nnx.state(model))
  with pytest.raises(error, match=match):
    api.prune(model, _x(2, 5), progress=False, **kwargs)
  assert (model.fc1.out_features, model.bn.num_features) == (7, 7)
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.state(model)))


def test_prune_rejects_what_it_cannot_prune():
  with pytest.raises(TypeError, match='must be a Flax Linen or NNX module or a function'):
    api.prune(object(), _x(2, 5), variables={}, ratio=0.5)
  with pytest.raises(ValueError, match='give example inputs'):
    api.prune(CNN(), variables={'params': {}}, ratio=0.5)


class _ShapeBranch(nn.Module):
  """A residual block that projects its input only when the widths differ."""

  features: int

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Dense(self.features, name='fc')(x))
    if x.shape[-1] != self.features:
      x = nn.Dense(self.features, name='proj')(x)
    return x + y


class _BranchyNet(nn.Module):
  block: int

  @nn.compact
  def __call__(self, x):
    x = _ShapeBranch(self.block, name='block')(nn.relu(nn.Dense(16, name='stem')(x)))
    return nn.Dense(3, name='head')(x)


@pytest.mark.parametrize(
  'block, flax_error',
  [
    (16, 'ScopeParamNotFoundError'),  # dense: no proj; pruned 12 != 16 wants one
    (12, 'TypeError'),  # dense: proj 16 -> 12; pruned 12 == 12 skips it
  ],
)
def test_linen_code_branching_on_shapes_is_explained(block, flax_error):
  model, x = _BranchyNet(block), _x(2, 8)
  variables = model.init(jax.random.key(0), x)
  explained = (
    rf'prune: result.apply fails on the pruned model \({flax_error}: .*branches on '
    r'shapes that pruning changed.*result.pruned_fn\(result.variables, x\)'
  )
  with pytest.raises(RuntimeError, match=explained):
    api.prune(model, x, variables=variables, ratio=0.25, constraint=EXACT)
  result = api.prune(model, x, variables=variables, ratio=0.25, constraint=EXACT, check=False)
  assert result.variables['params']['stem']['kernel'].shape == (8, 12)
  assert result.pruned_fn(result.variables, x).shape == (2, 3)
  with pytest.raises(RuntimeError, match=explained):
    result.apply(result.variables, x)
