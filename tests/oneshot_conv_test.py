"""jaxprune.oneshot on convolution kernels: Wanda and SparseGPT as matmuls over the input
patches, against numpy references that unfold the input by loops; and a small Flax ResNet
(BatchNorm, skips, a strided projection) whose every conv and head reach the target."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import conv_patches, row_mask, sparsegpt_reference

from jaxprune import oneshot

# A 3x3 convolution, stride 2, padding (1, 1) / (0, 1), dilation 1, NHWC input, HWIO kernel.
_WINDOW, _STRIDE, _PAD = (3, 3), 2, ((1, 1), (0, 1))


def _conv(groups, dilation=1):
  def fn(p, x):
    return jax.lax.conv_general_dilated(
      x,
      p['k'],
      (_STRIDE, _STRIDE),
      _PAD,
      rhs_dilation=(dilation, dilation),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      feature_group_count=groups,
      precision=jax.lax.Precision.HIGHEST,
    )

  return fn


def _setup(groups, channels=8, features=6, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(4, 7, 7, channels)) * np.exp(rng.normal(size=channels))
  kernel = rng.normal(size=(*_WINDOW, channels // groups, features))
  batches = [jnp.asarray(x[:2], jnp.float32), jnp.asarray(x[2:], jnp.float32)]
  return {'k': jnp.asarray(kernel, jnp.float32)}, batches, x, kernel


def _rows_of(kernel, groups):
  """The kernel as (groups, outputs per group, K), inputs ordered (a, b, c) as the patches."""
  kh, kw, per, features = kernel.shape
  w = np.moveaxis(kernel, 3, 0).reshape(features, kh * kw * per)
  return w.reshape(groups, features // groups, -1)


def _kernel_of(rows, shape):
  kh, kw, per, features = shape
  return np.moveaxis(rows.reshape(features, kh, kw, per), 0, 3)


def test_the_patch_reference_is_the_convolution():
  """The numpy patches times the kernel's rows give lax's convolution (checks the reference)."""
  for groups, dilation in ((1, 1), (2, 2)):
    params, batches, x, kernel = _setup(groups)
    out = np.asarray(_conv(groups, dilation)(params, jnp.asarray(x, jnp.float32)))
    rows = conv_patches(x, _WINDOW, _STRIDE, _PAD, dilation, groups)
    w = _rows_of(kernel, groups)
    expected = np.concatenate([rows[g] @ w[g].T for g in range(groups)], axis=1)
    np.testing.assert_allclose(out.reshape(-1, out.shape[-1]), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('nm', [None, (2, 4)], ids=['50%', '2:4'])
def test_wanda_on_a_convolution_is_the_numpy_rule(groups, nm):
  params, batches, x, kernel = _setup(groups)
  rows = conv_patches(x, _WINDOW, _STRIDE, _PAD, 1, groups)
  w = _rows_of(kernel, groups)
  keep = np.concatenate(
    [
      row_mask(np.abs(w[g]) * np.sqrt((rows[g] ** 2).sum(0)), None if nm else 0.5, nm)
      for g in range(groups)
    ]
  )
  expected = _kernel_of(keep, kernel.shape)
  new, masks = oneshot.prune(
    _conv(groups), params, batches, method='wanda', sparsity=None if nm else 0.5, nm=nm
  )
  np.testing.assert_array_equal(np.asarray(masks['k']), expected)
  np.testing.assert_array_equal(
    np.asarray(new['k']), np.where(expected, kernel, 0).astype(np.float32)
  )
  if nm:  # 2 of every 4 consecutive input channels, at each kernel position and output
    groups_of_4 = np.asarray(masks['k']).reshape(*_WINDOW, -1, 4, kernel.shape[3])
    np.testing.assert_array_equal(groups_of_4.sum(axis=3), 2)


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('nm', [None, (2, 4)], ids=['50%', '2:4'])
def test_sparsegpt_on_a_convolution_is_the_papers_update(groups, nm):
  """Each group of output features: Algorithm 1 with H = 2 P^T P / n of its patches P."""
  params, batches, x, kernel = _setup(groups)
  rows = conv_patches(x, _WINDOW, _STRIDE, _PAD, 1, groups)
  w = _rows_of(kernel, groups)
  solved = [
    sparsegpt_reference(
      w[g], 2 * rows[g].T @ rows[g] / len(rows[g]), 0.5, nm, blocksize=16, percdamp=0.01
    )
    for g in range(groups)
  ]
  expected_w = _kernel_of(np.concatenate([s[0] for s in solved]), kernel.shape)
  expected_mask = _kernel_of(np.concatenate([s[1] for s in solved]), kernel.shape)
  new, masks = oneshot.prune(
    _conv(groups),
    params,
    batches,
    method='sparsegpt',
    sparsity=None if nm else 0.5,
    nm=nm,
    blocksize=16,
  )
  np.testing.assert_array_equal(np.asarray(masks['k']), expected_mask)
  np.testing.assert_allclose(np.asarray(new['k']), expected_w, rtol=1e-3, atol=1e-3)


def test_other_layouts_and_flax_conv():
  """An NCHW / OIHW convolution prunes the same weights as the NHWC / HWIO one; a Flax
  `nn.Conv` kernel is a layer, its N:M groups along the input channels."""
  params, batches, _, kernel = _setup(1)
  _, expected = oneshot.prune(_conv(1), params, batches, method='wanda', sparsity=0.5)

  def nchw(p, x):
    return jax.lax.conv_general_dilated(
      x,
      p['k'],
      (_STRIDE, _STRIDE),
      _PAD,
      dimension_numbers=('NCHW', 'OIHW', 'NCHW'),
      precision=jax.lax.Precision.HIGHEST,
    )

  oihw = {'k': jnp.transpose(params['k'], (3, 2, 0, 1))}
  _, masks = oneshot.prune(
    nchw, oihw, [jnp.transpose(b, (0, 3, 1, 2)) for b in batches], method='wanda', sparsity=0.5
  )
  np.testing.assert_array_equal(
    np.asarray(masks['k']), np.transpose(np.asarray(expected['k']), (3, 2, 0, 1))
  )
  model = nn.Conv(6, (3, 3), strides=2, feature_group_count=2)
  variables = model.init(jax.random.key(0), batches[0])
  _, masks = oneshot.prune(model, variables['params'], batches, method='sparsegpt', nm='2:4')
  groups_of_4 = np.asarray(masks['kernel']).reshape(3, 3, 1, 4, 6)
  np.testing.assert_array_equal(groups_of_4.sum(axis=3), 2)
  assert masks['bias'] is None


def test_nm_that_does_not_divide_the_input_channels_is_an_error():
  """1:3 over 3 x 3 x 4 = 36 inputs would cross kernel positions: M must divide the 4
  input channels (per group)."""
  params, batches, _, _ = _setup(1, channels=4)
  with pytest.raises(
    ValueError,
    match=r"convolution 'k' has 4 input features per group, "
    r'not divisible by M=3',
  ):
    oneshot.prune(_conv(1), params, batches, method='wanda', nm='1:3')


class _Block(nn.Module):
  """conv-BatchNorm-relu-conv-BatchNorm plus the input (through a strided 1x1 projection
  conv where the shape changes), then relu: a ResNet basic block with frozen statistics."""

  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x):
    y = nn.Conv(self.features, (3, 3), self.strides, use_bias=False, name='conv_0')(x)
    y = nn.relu(nn.BatchNorm(use_running_average=True, name='bn_0')(y))
    y = nn.Conv(self.features, (3, 3), use_bias=False, name='conv_1')(y)
    y = nn.BatchNorm(use_running_average=True, name='bn_1')(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      x = nn.Conv(self.features, (1, 1), self.strides, use_bias=False, name='proj')(x)
    return nn.relu(x + y)


class _ResNet(nn.Module):
  """Stem conv, a block at 8 channels, a strided block to 16 with a projection, global
  average pooling, a Dense head."""

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(8, (3, 3), use_bias=False, name='stem')(x)
    x = nn.relu(nn.BatchNorm(use_running_average=True, name='stem_bn')(x))
    x = _Block(8, name='block_0')(x)
    x = _Block(16, strides=2, name='block_1')(x)
    return nn.Dense(10, name='head')(x.mean(axis=(1, 2)))


# Every kernel of _ResNet: its name and shape (HWIO for the convs, (in, out) for the head).
_KERNELS = {
  'stem/kernel': (3, 3, 4, 8),
  'block_0/conv_0/kernel': (3, 3, 8, 8),
  'block_0/conv_1/kernel': (3, 3, 8, 8),
  'block_1/conv_0/kernel': (3, 3, 8, 16),
  'block_1/conv_1/kernel': (3, 3, 16, 16),
  'block_1/proj/kernel': (1, 1, 8, 16),
  'head/kernel': (16, 10),
}


def _at(tree, name):
  """The leaf `name` ('block_1/proj/kernel') of a params or masks tree, as numpy."""
  for key in name.split('/'):
    tree = tree[key]
  return np.asarray(tree)


def _masked_names(masks):
  """The names of the leaves of a mask tree that hold a mask (not None)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(masks, is_leaf=lambda m: m is None)
  return sorted('/'.join(key.key for key in path) for path, m in flat if m is not None)


@pytest.mark.slow
@pytest.mark.parametrize('method', ['wanda', 'sparsegpt'])
@pytest.mark.parametrize('nm', [None, (2, 4)], ids=['50%', '2:4'])
def test_a_resnet_prunes_every_conv_and_the_head(method, nm):
  """Every conv of a small ResNet (stem, 3x3s, the strided 1x1 projection) and the Dense
  head is pruned to the target, nothing is left dense with a warning, the params passed in
  are untouched; Wanda's stem mask, whose inputs are the images, is the numpy rule."""
  images = np.random.default_rng(0).normal(size=(16, 8, 8, 4)).astype(np.float32)
  batches = [jnp.asarray(images[:8]), jnp.asarray(images[8:])]
  model = _ResNet()
  variables = model.init(jax.random.key(0), batches[0])
  params, stats = variables['params'], variables['batch_stats']
  before = jax.tree.map(np.array, params)
  fn = lambda p, x: model.apply({'params': p, 'batch_stats': stats}, x)
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # no weight left dense with a warning
    new, masks, report = oneshot.prune_with_report(
      fn, params, batches, method=method, sparsity=None if nm else 0.5, nm=nm
    )
  assert report.skipped == ()
  assert sorted(layer.name for layer in report.layers) == sorted(_KERNELS)
  assert {layer.target for layer in report.layers} == {'2:4' if nm else '50%'}
  for name, shape in _KERNELS.items():
    mask, kernel = _at(masks, name), _at(new, name)
    assert mask.shape == shape, name
    assert not kernel[~mask].any(), name  # the pruned weights are zero
    inputs = int(np.prod(shape[:-1]))
    per_output = mask.reshape(inputs, shape[-1]).sum(axis=0)
    if nm:  # 2 of every 4 consecutive input channels, per position and output
      groups = mask.reshape(*shape[:-2], shape[-2] // 4, 4, shape[-1]).sum(axis=-2)
      np.testing.assert_array_equal(groups, 2, err_msg=name)
    elif method == 'wanda':  # each output keeps half of its inputs
      np.testing.assert_array_equal(per_output, inputs // 2, err_msg=name)
    else:  # SparseGPT: half of each column block (so of the layer)
      assert mask.sum() == mask.size // 2, name
    if method == 'wanda':  # no weight update: the kept weights are the originals
      np.testing.assert_array_equal(kernel[mask], _at(before, name)[mask], err_msg=name)
  assert _masked_names(masks) == sorted(_KERNELS)  # BatchNorm's and the biases: None
  if method == 'wanda':
    rows = conv_patches(images, (3, 3), 1, ((1, 1), (1, 1)), 1, 1)[0]  # (16*64, 36)
    expected = row_mask(
      np.abs(_rows_of(before['stem']['kernel'], 1)[0]) * np.sqrt((rows**2).sum(0)),
      None if nm else 0.5,
      nm,
    )
    np.testing.assert_array_equal(
      _at(masks, 'stem/kernel'), _kernel_of(expected, _KERNELS['stem/kernel'])
    )
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params), before)


def _one_feature_conv(seed=0):
  """A 3x3 kernel over one input feature, 8 outputs: 9 inputs per output row."""
  rng = np.random.default_rng(seed)
  params = {'k': jnp.asarray(rng.normal(size=(3, 3, 1, 8)), jnp.float32)}
  x = rng.normal(size=(4, 6, 6, 1)) * 2.0

  def fn(p, x):
    return jax.lax.conv_general_dilated(
      x, p['k'], (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )

  return fn, params, [jnp.asarray(x, jnp.float32)], x


@pytest.mark.parametrize('method', ['magnitude', 'wanda', 'sparsegpt'])
def test_each_method_reaches_the_layer_target_with_9_inputs_per_row(method):
  """50% of 8 rows of 9: 36 zeros, each row 4 or 5 for the per-row rules (Wanda pruned 4
  of 9 in each row: 44.4%)."""
  fn, params, batches, x = _one_feature_conv()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    _, masks, report = oneshot.prune_with_report(
      fn, params, batches, method=method, sparsity=0.5, per_row=method == 'magnitude'
    )
  rows = _rows_of(np.asarray(masks['k']), 1)[0]
  assert int((~rows).sum()) == 36
  if method != 'sparsegpt':  # its masks are chosen per block of columns, not per row
    assert set((~rows).sum(axis=1).tolist()) == {4, 5}
  assert report.layers[0].sparsity == 0.5 and report.short == ()
  if method == 'wanda':
    patches = conv_patches(x, (3, 3), 1, ((1, 1), (1, 1)), 1, 1)[0]
    sqnorm = (patches**2).sum(axis=0)
    w = _rows_of(np.asarray(params['k']), 1)[0]
    np.testing.assert_array_equal(rows, row_mask(np.abs(w) * np.sqrt(sqnorm), 0.5, None))


def test_a_layer_left_off_its_target_is_named_in_a_warning_and_the_report(monkeypatch, request):
  """Were a rule to round each row alone (4 of 9), the layer would be named."""
  from jaxprune.oneshot import _layer_prune, _solvers

  def rounded_per_row(w, sqnorm, *, sparsity, nm):
    scores = jnp.abs(w) * jnp.sqrt(sqnorm)
    k = round(sparsity * w.shape[1])
    return ~_solvers.ranking.lowest_k_stable(scores, k, axis=1)

  monkeypatch.setattr(_solvers, 'wanda', rounded_per_row)
  # The jitted layer step traces the patched rule afresh, and no later test reuses it.
  _layer_prune._prune_leaf.clear_cache()
  request.addfinalizer(_layer_prune._prune_leaf.clear_cache)
  fn, params, batches, _ = _one_feature_conv()
  message = r'did not reach their target sparsity: k 44\.4% \(target 50%\)'
  with pytest.warns(UserWarning, match=message):
    _, _, report = oneshot.prune_with_report(fn, params, batches, method='wanda', sparsity=0.5)
  assert report.short == (('k', pytest.approx(4 / 9), '50%'),)
  assert 'short of target: k 44.4% (target 50%)' in str(report)


def test_a_valid_convolution_larger_than_its_input_is_a_clear_error():
  """A 3x3 VALID convolution of a 2x2 image has no output position: nothing to rank by."""

  def fn(p, x):
    return jax.lax.conv_general_dilated(
      x, p['k'], (1, 1), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )

  params = {'k': jnp.asarray(np.random.default_rng(0).normal(size=(3, 3, 3, 4)), jnp.float32)}
  batches = [jnp.ones((2, 2, 2, 3))]
  for method in ('wanda', 'sparsegpt'):
    message = r"^oneshot.prune: layer 'k' multiplied no input .* or leave it dense with overrides"
    with pytest.raises(ValueError, match=message):
      oneshot.prune(fn, params, batches, method=method, sparsity=0.5)
  _, masks = oneshot.prune(fn, params, batches, method='magnitude', sparsity=0.5)
  assert int((~masks['k']).sum()) == 54  # needs no inputs: half of 108
