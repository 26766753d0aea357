"""`layer_axes_map`'s '@' form: the layer axis of a stacked leaf anywhere in its shape.

MaxText stores scanned weights with the layer axis second (`param_scan_axis=1`): a
kernel of shape (embed, layers, mlp). 'regex:@1' gives each of its layers its own
threshold, target, blocks and N:M groups, as 'regex:1' does for (layers, embed, mlp).
The references are numpy sorts, numpy histograms and the leading-axis layout.
"""

import json
import os
import subprocess
import sys
import warnings

import cpu_devices
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pruning_helpers as helpers
import pytest

import jaxprune
from jaxprune._config import maps as maps
from jaxprune._config import specs as specs

EMBED, LAYERS, MLP = 64, 4, 96
SCRIPT = os.path.join(os.path.dirname(__file__), 'layer_axes_multidevice.py')


def _maxtext(seed=0):
  """An (embed, layers, mlp) kernel whose layers have different scales (1x to 4x)."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(EMBED, LAYERS, MLP)).astype(np.float32)
  return w * np.arange(1, LAYERS + 1, dtype=np.float32)[None, :, None]


def _hp(layers, **overrides):
  fields = dict(target_sparsity=0.5, layer_axes_map=[f'decoder/.*kernel:{layers}'])
  return helpers.hparams(**{**fields, **helpers.ONE_SHOT, **overrides})


def _tx(form, hp):
  opt = optax.sgd(0.0)
  return jaxprune.pruned(opt, hp) if form == 'pruned' else optax.chain(opt, jaxprune.pruning(hp))


def _pruned(kernel, hp, form='pruned', steps=2):
  """The kernel, thresholds and mask after `steps` jitted optimizer steps (zero gradients)."""
  params = {'decoder': {'mlp': {'kernel': jnp.asarray(kernel)}}}
  tx = _tx(form, hp)
  state = tx.init(params)

  @jax.jit
  def step(p, s):
    updates, s = tx.update(jax.tree.map(jnp.zeros_like, p), s, p)
    return optax.apply_updates(p, updates), s

  for _ in range(steps):
    params, state = step(params, state)
  name = 'decoder/mlp/kernel'
  return (
    np.asarray(params['decoder']['mlp']['kernel']),
    np.asarray(jaxprune.get_thresholds(state)[name]),
    np.asarray(jaxprune.get_masks(state)['decoder']['mlp']['kernel']),
  )


def test_parse_the_axis_index_form_and_keep_the_leading_count():
  hp = {'layer_axes_map': ['scan/kernel:1', 'decoder/.*:@1', 'x:y:@0@-1']}
  assert maps.layer_axes_map(hp) == [('scan/kernel', 1), ('decoder/.*', (1,)), ('x:y', (0, -1))]


@pytest.mark.parametrize(
  'entry, message',
  [
    ('d:@', r'each layer axis after "@" must be an integer axis index, e\.g\. "d:@1"'),
    ('d:@x', 'integer axis index'),
    ('d:@1@', 'integer axis index'),
    ('d:@01', 'integer axis index'),
    ('d:@1@1', 'axis 1 is named twice; name each layer axis once'),
    ('d:one', r'integer >= 1, e\.g\. "d:1", or the layer axis by its index, e\.g\. "d:@1"'),
  ],
)
def test_bad_axis_entries_are_one_line_naming_the_entry_and_fix(entry, message):
  with pytest.raises(ValueError, match=f'layer_axes_map entry {entry}: .*{message}') as err:
    jaxprune.parse_hparams(f'layer_axes_map=[{entry}]')
  assert '\n' not in str(err.value)


@pytest.mark.parametrize(
  'entry, message',
  [
    (
      '@3',
      r"layer_axes_map: leaf 'decoder/mlp/kernel' of shape \(64, 4, 96\) has no axis 3 "
      r"\(entry value '@3'\): its axes are 0 to 2, or -3 to -1 from the end\. Give the "
      r"stacked axis's index, or narrow the entry's regex to the stacked leaves\.",
    ),
    ('@-4', 'has no axis -4'),
    ('@1@-2', r"entry value '@1@-2' names the same axis twice"),
    ('@0@1', r'has 1 axes left after its 2 layer axes'),
  ],
)
def test_bad_axes_for_a_leaf_are_one_line_naming_leaf_shape_and_fix(entry, message):
  params = {'decoder': {'mlp': {'kernel': jnp.zeros((EMBED, LAYERS, MLP))}}}
  with pytest.raises(ValueError, match=message) as err:
    jaxprune.pruning(_hp(entry)).init(params)
  assert '\n' not in str(err.value)


def test_specs_hold_the_axes_and_each_layer_shape_resolves_blocks():
  params = {'decoder': {'mlp': {'kernel': jnp.zeros((EMBED, LAYERS, MLP))}}}
  (leaf,) = specs.spec_leaves(specs.leaf_specs(params, _hp('@-2', block_dims_map=['mlp:2x-1'])))
  assert (leaf.layer_axes, leaf.layer_at, leaf.block_dims) == (1, (1,), (2, MLP))
  (zero,) = specs.spec_leaves(specs.leaf_specs(params, _hp('@0')))
  assert (zero.layer_axes, zero.layer_at) == (1, ())  # '@0' is the leading form ':1'


@pytest.mark.slow
@pytest.mark.parametrize('form', ['pruned', 'chain'])
def test_exact_puts_every_layer_at_the_target_as_a_sort_does(form):
  w = _maxtext()
  kernel, thresholds, mask = _pruned(w, _hp('@1', threshold_method='exact'), form)
  # 64 * 96 = 6,144 weights per layer keep round(6,144 * 0.5) = 3,072 each.
  assert ((kernel == 0).sum(axis=(0, 2)) == 3072).all()
  assert thresholds.shape == (LAYERS,)
  for layer in range(LAYERS):
    a = np.abs(w[:, layer, :])
    kth = np.sort(a.ravel())[-3072]  # the 3,072th largest magnitude
    assert thresholds[layer] == kth
    np.testing.assert_array_equal(mask[:, layer, :], a >= kth)
  # One threshold for the whole leaf (no map) leaves the 1x layer far above 50%, the 4x
  # far below: what the '@' form fixes.
  plain = helpers.hparams(target_sparsity=0.5, threshold_method='exact', **helpers.ONE_SHOT)
  kernel, _, _ = _pruned(w, plain, form)
  share = (kernel == 0).mean(axis=(0, 2))
  assert share[0] > 0.7 and share[-1] < 0.35


def _histogram_threshold(a, sparsity, nbins):
  """TF's rule in numpy float32 (SPEC.md): the lower edge of the first bin whose CDF
  reaches the sparsity."""
  m = np.float32(a.max())
  q = (a.astype(np.float64) / np.float64(m)).astype(np.float32)
  bins = np.clip(np.floor(np.float32(nbins) * q), 0, nbins - 1).astype(np.int64)
  cdf = (np.cumsum(np.bincount(bins.ravel(), minlength=nbins)) / a.size).astype(np.float32)
  below = int((cdf < np.float32(sparsity)).sum())
  return np.float32(np.float32(below / nbins) * m), np.bincount(bins.ravel()).max() / a.size


@pytest.mark.slow
@pytest.mark.parametrize('form', ['pruned', 'chain'])
def test_histogram_puts_every_layer_within_one_bin_of_the_target(form):
  w = _maxtext(1)
  kernel, thresholds, mask = _pruned(w, _hp('@1'), form)
  for layer in range(LAYERS):
    a = np.abs(w[:, layer, :])
    reference, bin_share = _histogram_threshold(a, 0.5, 256)
    assert thresholds[layer] == reference
    np.testing.assert_array_equal(mask[:, layer, :], a > reference)
    share = (kernel[:, layer, :] == 0).mean()
    assert 0.5 - bin_share <= share <= 0.5


def test_blocks_are_pooled_within_each_layer():
  """4x8 AVG blocks of each (embed, mlp) layer: 16 x 12 = 192 blocks keep 96."""
  w = _maxtext(2)
  hp = _hp('@1', threshold_method='exact', block_dims_map=['mlp/kernel:4x8'])
  _, thresholds, mask = _pruned(w, hp)
  for layer in range(LAYERS):
    a = np.abs(w[:, layer, :])
    pooled = a.astype(np.float64).reshape(16, 4, 12, 8).mean(axis=(1, 3))
    kth = np.sort(pooled.ravel())[-96]
    assert np.isclose(thresholds[layer], kth, rtol=1e-6)
    keep = np.repeat(np.repeat(pooled >= kth, 4, axis=0), 8, axis=1)
    np.testing.assert_array_equal(mask[:, layer, :], keep)
    assert keep.sum() == 96 * 32


@pytest.mark.parametrize('form', ['pruned', 'chain'])
def test_nm_groups_run_along_each_layers_input_axis(form):
  """2:4 along embed (each layer's input axis), not across the 4 layers."""
  w = _maxtext(3)
  hp = helpers.hparams(
    nm_sparsity_map=['mlp/kernel:2:4'], layer_axes_map=['decoder/.*kernel:@1'], **helpers.ONE_SHOT
  )
  _, _, mask = _pruned(w, hp, form)
  groups = np.abs(w).reshape(EMBED // 4, 4, LAYERS, MLP)
  order = np.argsort(-groups, axis=1, kind='stable')  # the 2 largest of each 4 kept
  keep = np.zeros(groups.shape, bool)
  np.put_along_axis(keep, order[:, :2], True, axis=1)
  np.testing.assert_array_equal(mask, keep.reshape(w.shape))


@pytest.mark.slow
@pytest.mark.parametrize(
  'overrides',
  [
    {},
    {'threshold_method': 'exact'},
    {'block_dims_map': ['mlp/kernel:4x4'], 'block_pooling_function': 'MAX'},
    {'block_dims_map': ['mlp/kernel:4x4'], 'threshold_method': 'exact'},
    {'global_pruning': True},
    {'threshold_decay': 0.5},
  ],
  ids=['histogram', 'exact', 'max_blocks', 'avg_blocks_exact', 'global', 'decay'],
)
def test_the_layer_axis_second_equals_the_leading_layout_transposed(overrides):
  """(layers, embed, mlp) with 'regex:1' (the leading form) and the same data as
  (embed, layers, mlp) with 'regex:@1': the same thresholds, the masks transposed."""
  w = _maxtext(4)
  lead = np.ascontiguousarray(np.moveaxis(w, 1, 0))
  kernel_a, thresholds_a, mask_a = _pruned(lead, _hp('1', **overrides), steps=3)
  kernel_b, thresholds_b, mask_b = _pruned(w, _hp('@1', **overrides), steps=3)
  np.testing.assert_array_equal(thresholds_b, thresholds_a)
  np.testing.assert_array_equal(mask_b, np.moveaxis(mask_a, 0, 1))
  np.testing.assert_array_equal(kernel_b, np.moveaxis(kernel_a, 0, 1))
  assert 0 < (~mask_b).mean() <= 0.5


@pytest.mark.slow
def test_two_layer_axes_anywhere_equal_two_leading_ones():
  rng = np.random.default_rng(5)
  w = rng.normal(size=(2, 16, 3, 24)).astype(np.float32)  # layer axes 0 and 2
  lead = np.ascontiguousarray(np.moveaxis(w, 2, 1))  # (2, 3, 16, 24)
  _, thresholds_a, mask_a = _pruned(lead, _hp('2', threshold_method='exact'))
  _, thresholds_b, mask_b = _pruned(w, _hp('@0@-2', threshold_method='exact'))
  assert thresholds_b.shape == (2, 3)
  np.testing.assert_array_equal(thresholds_b, thresholds_a)
  np.testing.assert_array_equal(mask_b, np.moveaxis(mask_a, 1, 2))
  assert ((~mask_b).sum(axis=(1, 3)) == 16 * 24 // 2).all()


def _run(params, hp):
  tx = jaxprune.pruning(hp)
  return helpers.run_updates(tx, params, 2)


def test_summaries_hold_each_layer_to_its_target_and_name_it():
  """Layer 3 of an (embed, layers, mlp) stack holds an outlier: the histogram leaves it at
  0% while the others reach 50%; the warning names that layer by its index."""
  w = _maxtext(6) / np.arange(1, LAYERS + 1, dtype=np.float32)[None, :, None]
  w[0, 3, 0] = 1e4
  hp = _hp('@1')
  state = _run({'decoder': {'mlp': {'kernel': jnp.asarray(w)}}}, hp)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    out = jaxprune.summaries(state, hp)
  messages = [str(c.message) for c in caught if 'far below' in str(c.message)]
  assert len(messages) == 1
  assert 'target sparsity: decoder/mlp/kernel[3] 0.0% (target 50.0%).' in messages[0]
  assert out['decoder/mlp/kernel/threshold'].shape == (LAYERS,)
  # 3 layers at 50% (within a bin), 1 at 0%: about 37.5% of the leaf.
  assert abs(float(jaxprune.get_weight_sparsity(state)['decoder/mlp/kernel']) - 0.375) < 0.01
  # Without the map, the one threshold of the whole leaf is what the outlier sets.
  plain = helpers.hparams(target_sparsity=0.5, **helpers.ONE_SHOT)
  state = _run({'decoder': {'mlp': {'kernel': jnp.asarray(w)}}}, plain)
  assert jaxprune.get_thresholds(state)['decoder/mlp/kernel'].shape == ()


def test_without_hparams_a_stack_with_its_layer_axis_inside_is_judged_whole():
  """Without hparams the layer axis is not known: the leaf, not its embed rows, is named."""
  w = _maxtext(8)
  w[0, :, 0] = 1e4  # an outlier in every layer: the histogram prunes none
  state = _run({'decoder': {'mlp': {'kernel': jnp.asarray(w)}}}, _hp('@1'))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    jaxprune.summaries(state)
  (message,) = [str(c.message) for c in caught if 'far below' in str(c.message)]
  assert 'target sparsity: decoder/mlp/kernel 0.0% (target 50.0%).' in message


def test_a_layer_of_subnormal_weights_is_named_by_its_index():
  w = _maxtext(7)
  w[:, 2, :] *= np.float32(1e-40)
  params = {'decoder': {'mlp': {'kernel': w}}}
  with pytest.warns(UserWarning, match=r'all subnormal.*: decoder/mlp/kernel\[2\] \(largest'):
    jaxprune.pruning(_hp('@1')).init(params)


@pytest.mark.slow
def test_a_sharded_stack_keeps_its_sharding_and_equals_one_device():
  """On a 2x2 CPU mesh: (embed, layers, mlp) stacks sharded along embed and mlp, and one
  with its layer axis sharded; two jitted steps with no out_shardings."""
  result = subprocess.run(
    [sys.executable, SCRIPT],
    capture_output=True,
    text=True,
    env=cpu_devices.env(4),
    timeout=600,
    cwd=os.path.dirname(__file__),
  )
  assert result.returncode == 0, result.stderr[-4000:]
  runs = json.loads(result.stdout.strip().splitlines()[-1])
  for name, run in runs.items():
    for check in (
      'params_sharding_kept',
      'masks_sharding_kept',
      'params_equal',
      'masks_equal',
      'thresholds_equal',
    ):
      assert run[check], (name, check)
    masks = np.asarray(run['masks'][0])
    assert ((~masks).sum(axis=(0, 2)) == 64 * 96 // 2).all(), name
  leading = runs.pop('leading/pruned')
  for name, run in runs.items():
    assert run['thresholds'] == leading['thresholds'], name
    assert run['masks'] == leading['masks'], name
  # The same communication as the leading layout: the moved axes add no collective.
  assert runs['auto/pruned']['collectives'] == leading['collectives']
