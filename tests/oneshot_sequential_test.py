"""`oneshot.prune(sequential=...)`: layer by layer, all at once, or block by block as the
authors' Wanda, OWL and RIA loops go, against a numpy reference of that loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune import oneshot

WIDTH = 8


def model(params, x):
  for block in ('block_0', 'block_1'):
    h = jax.nn.relu(x @ params[block]['a']['kernel'])
    x = h @ params[block]['b']['kernel']
  return x


def make_params():
  keys = jax.random.split(jax.random.key(0), 4)
  kernels = [jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) for k in keys]
  return {
    'block_0': {'a': {'kernel': kernels[0]}, 'b': {'kernel': kernels[1]}},
    'block_1': {'a': {'kernel': kernels[2]}, 'b': {'kernel': kernels[3]}},
  }


BATCHES = [jax.random.normal(jax.random.key(9 + i), (16, WIDTH), jnp.float32) for i in range(2)]


def wanda_mask(kernel, inputs, sparsity):
  """Keeps, in each output (a kernel column), the largest |W_jo| * ||x_j||_2."""
  norms = np.sqrt(np.sum(np.square(inputs.astype(np.float64)), axis=0))
  score = np.abs(kernel.astype(np.float64)) * norms[:, None]
  pruned = int(round(sparsity * kernel.shape[0]))
  keep = np.ones(kernel.shape, bool)
  for o in range(kernel.shape[1]):
    keep[np.argsort(score[:, o], kind='stable')[:pruned], o] = False
  return keep


def blockwise_reference(params, sparsity):
  """The authors' loop: each block's layers measured on the block's dense run, with the
  blocks before it already pruned."""
  p = jax.tree.map(np.asarray, params)
  masks = {}
  xs = [np.asarray(b) for b in BATCHES]
  for block in ('block_0', 'block_1'):
    a, b = p[block]['a']['kernel'], p[block]['b']['kernel']
    hs = [np.maximum(x @ a, 0) for x in xs]
    mask_a = wanda_mask(a, np.concatenate(xs), sparsity)
    mask_b = wanda_mask(b, np.concatenate(hs), sparsity)
    masks[block] = {'a': {'kernel': mask_a}, 'b': {'kernel': mask_b}}
    p[block]['a']['kernel'], p[block]['b']['kernel'] = a * mask_a, b * mask_b
    xs = [np.maximum(x @ p[block]['a']['kernel'], 0) @ p[block]['b']['kernel'] for x in xs]
  return masks


def test_a_regex_prunes_block_by_block_as_the_authors_loop_does():
  params = make_params()
  expected = blockwise_reference(params, 0.5)
  _, masks = oneshot.prune(
    model, params, BATCHES, method='wanda', sparsity=0.5, sequential=r'^block_\d+/'
  )
  for got, want in zip(jax.tree.leaves(masks), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(np.asarray(got), want)
  # Layer by layer differs: block_0/b is then measured after block_0/a is pruned.
  _, layerwise = oneshot.prune(model, params, BATCHES, method='wanda', sparsity=0.5)
  assert not np.array_equal(layerwise['block_0']['b']['kernel'], expected['block_0']['b']['kernel'])
  # One block per layer is the layer-by-layer order.
  _, per_layer = oneshot.prune(
    model, params, BATCHES, method='wanda', sparsity=0.5, sequential=r'^block_\d+/[ab]/'
  )
  jax.tree.map(np.testing.assert_array_equal, per_layer, layerwise)


def test_a_layer_outside_every_block_is_a_block_of_its_own():
  params = make_params()
  _, by_blocks = oneshot.prune(
    model, params, BATCHES, method='wanda', sparsity=0.5, sequential=r'^block_0/'
  )
  expected = blockwise_reference(params, 0.5)
  jax.tree.map(np.testing.assert_array_equal, by_blocks['block_0'], expected['block_0'])
  # block_1's layers, which the regex does not match, go one at a time: as if each
  # were named a block.
  _, named = oneshot.prune(
    model, params, BATCHES, method='wanda', sparsity=0.5, sequential=r'^block_0/|^block_1/./'
  )
  jax.tree.map(np.testing.assert_array_equal, by_blocks, named)
  _, together = oneshot.prune(
    model, params, BATCHES, method='wanda', sparsity=0.5, sequential=r'^block_\d/'
  )
  assert not np.array_equal(by_blocks['block_1']['b']['kernel'], together['block_1']['b']['kernel'])


@pytest.mark.parametrize(
  'sequential, message',
  [
    ('(', r"sequential='\(': not a valid regex"),
    ('^decoder/', r"sequential='\^decoder/' matches no layer name \(they look like 'block_0/a"),
    ('', r"sequential='': give True, False or a regex naming blocks"),
    (1, r'sequential=1: give True, False or a regex naming blocks'),
  ],
)
def test_a_bad_sequential_is_one_line_naming_the_fix(sequential, message):
  with pytest.raises(ValueError, match=message):
    oneshot.prune(
      model, make_params(), BATCHES, method='wanda', sparsity=0.5, sequential=sequential
    )
