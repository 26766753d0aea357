"""oneshot.prune_offloaded / prune_checkpoint: one block on the device at a time gives the
masks and weights of the in-memory `oneshot.prune` of the whole stack, bit for bit."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxprune import oneshot

WIDTH, HIDDEN, DEPTH = 16, 32, 3


def block_fn(p, x):
  """A pre-norm residual block: attention-free token mixing, then a gated MLP."""
  h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * p['norm']
  x = x + jnp.tanh(h @ p['mix']) @ p['out']
  h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
  return x + (jax.nn.silu(h @ p['gate']) * (h @ p['up'])) @ p['down']


def make_blocks(depth=DEPTH, seed=0):
  rng = np.random.default_rng(seed)

  def w(m, n):
    return (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32)

  return [
    {
      'norm': (1 + 0.1 * rng.normal(size=WIDTH)).astype(np.float32),
      'mix': w(WIDTH, WIDTH),
      'out': w(WIDTH, WIDTH),
      'gate': w(WIDTH, HIDDEN),
      'up': w(WIDTH, HIDDEN),
      'down': w(HIDDEN, WIDTH),
    }
    for _ in range(depth)
  ]


def calibration(count=2, seed=1):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=(4, 8, WIDTH)).astype(np.float32) for _ in range(count)]


def unrolled(params, x):
  for p in params['blocks']:
    x = block_fn(p, x)
  return x


def scanned(params, x):
  return jax.lax.scan(lambda h, p: (block_fn(p, h), None), x, params['blocks'])[0]


def stack(blocks):
  return jax.tree.map(lambda *xs: np.stack(xs), *blocks)


def assert_same(got, want):
  is_none = lambda x: x is None
  got_leaves = jax.tree.leaves(got, is_leaf=is_none)
  want_leaves = jax.tree.leaves(want, is_leaf=is_none)
  assert jax.tree.structure(got, is_leaf=is_none) == jax.tree.structure(want, is_leaf=is_none)
  for g, w in zip(got_leaves, want_leaves, strict=True):
    assert (g is None) == (w is None)
    if g is not None:
      assert isinstance(g, np.ndarray)  # back on the host
      np.testing.assert_array_equal(g, np.asarray(w))


TARGETS = [
  ('magnitude', {'sparsity': 0.5}),
  ('magnitude', {'nm': '2:4'}),
  ('wanda', {'sparsity': 0.5}),
  ('wanda', {'nm': '2:4'}),
  pytest.param('sparsegpt', {'sparsity': 0.5, 'blocksize': 8}, marks=pytest.mark.slow),
  pytest.param('sparsegpt', {'nm': '2:4', 'blocksize': 8}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize('method,target', TARGETS)
def test_list_of_blocks_matches_the_in_memory_path_bit_for_bit(method, target):
  blocks, batches = make_blocks(), calibration()
  want, want_masks = oneshot.prune(unrolled, {'blocks': blocks}, batches, method=method, **target)
  got, masks = oneshot.prune_offloaded(block_fn, blocks, batches, method=method, **target)
  assert_same(got, want['blocks'])
  assert_same(masks, want_masks['blocks'])
  # Half of every pruned kernel is zero; the norm scale is no layer.
  for m in masks:
    assert m['norm'] is None
    assert all(m[k].mean() == 0.5 for k in ('mix', 'out', 'gate', 'up', 'down'))


@pytest.mark.parametrize(
  'method,target', [('wanda', {'nm': '2:4'}), ('sparsegpt', {'sparsity': 0.5, 'blocksize': 8})]
)
def test_a_scanned_stack_matches_the_in_memory_path_bit_for_bit(method, target):
  blocks, batches = stack(make_blocks()), calibration()
  want, want_masks = oneshot.prune(scanned, {'blocks': blocks}, batches, method=method, **target)
  got, masks = oneshot.prune_offloaded(
    block_fn, blocks, batches, method=method, stacked=True, **target
  )
  assert_same(got, want['blocks'])
  assert_same(masks, want_masks['blocks'])
  assert masks['up'].shape == (DEPTH, WIDTH, HIDDEN)


def test_the_params_given_are_not_changed():
  blocks = make_blocks()
  before = [dict((k, v.copy()) for k, v in b.items()) for b in blocks]
  oneshot.prune_offloaded(block_fn, blocks, calibration(), method='wanda', sparsity=0.5)
  assert_same(blocks, before)


def test_a_checkpoint_is_pruned_into_a_new_one(tmp_path):
  blocks, batches = make_blocks(), calibration()
  ocp.PyTreeCheckpointer().save(tmp_path / 'dense', blocks)
  masks = oneshot.prune_checkpoint(
    block_fn,
    tmp_path / 'dense',
    tmp_path / 'pruned',
    batches,
    like=blocks,
    method='sparsegpt',
    nm='2:4',
    blocksize=8,
  )
  want, want_masks = oneshot.prune(
    unrolled, {'blocks': blocks}, batches, method='sparsegpt', nm='2:4', blocksize=8
  )
  restore = [jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), b) for b in blocks]
  written = ocp.PyTreeCheckpointer().restore(
    tmp_path / 'pruned', args=ocp.args.PyTreeRestore(item=blocks, restore_args=restore)
  )
  assert_same(written, want['blocks'])
  assert_same(masks, want_masks['blocks'])
  dense = ocp.PyTreeCheckpointer().restore(
    tmp_path / 'dense', args=ocp.args.PyTreeRestore(item=blocks, restore_args=restore)
  )
  assert_same(dense, blocks)  # the source is untouched


def test_a_stacked_checkpoint_is_pruned_into_a_new_one(tmp_path):
  blocks, batches = stack(make_blocks()), calibration()
  ocp.PyTreeCheckpointer().save(tmp_path / 'dense', blocks)
  like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), blocks)
  masks = oneshot.prune_checkpoint(
    block_fn,
    tmp_path / 'dense',
    tmp_path / 'pruned',
    batches,
    like=like,
    method='wanda',
    sparsity=0.5,
    stacked=True,
  )
  _, want_masks = oneshot.prune(scanned, {'blocks': blocks}, batches, method='wanda', sparsity=0.5)
  assert_same(masks, want_masks['blocks'])


def test_a_failed_run_writes_no_checkpoint(tmp_path):
  blocks = make_blocks()
  blocks[2]['up'][0, 0] = np.nan  # the last block cannot be pruned
  ocp.PyTreeCheckpointer().save(tmp_path / 'dense', blocks)
  with pytest.raises(ValueError, match='NaN'):
    oneshot.prune_checkpoint(
      block_fn,
      tmp_path / 'dense',
      tmp_path / 'pruned',
      calibration(),
      like=blocks,
      method='wanda',
      sparsity=0.5,
    )
  assert not os.path.exists(tmp_path / 'pruned')
  assert sorted(os.listdir(tmp_path)) == ['dense']


def test_an_existing_out_path_is_refused_and_kept(tmp_path):
  blocks = make_blocks()
  ocp.PyTreeCheckpointer().save(tmp_path / 'dense', blocks)
  (tmp_path / 'good').mkdir()
  (tmp_path / 'good' / 'keep').write_text('x')
  with pytest.raises(ValueError, match=r"out_path=.*good' exists; give a new path"):
    oneshot.prune_checkpoint(
      block_fn,
      tmp_path / 'dense',
      tmp_path / 'good',
      calibration(),
      like=blocks,
      method='wanda',
      sparsity=0.5,
    )
  assert (tmp_path / 'good' / 'keep').read_text() == 'x'


def test_a_missing_checkpoint_is_one_line_naming_the_path(tmp_path):
  with pytest.raises(ValueError) as err:
    oneshot.prune_checkpoint(
      block_fn,
      tmp_path / 'nowhere',
      tmp_path / 'out',
      calibration(),
      like=make_blocks(),
      method='wanda',
      sparsity=0.5,
    )
  message = str(err.value)
  assert '\n' not in message
  assert f'path={str(tmp_path / "nowhere")!r} is not a checkpoint' in message


def test_a_checkpoint_of_another_model_is_one_line_naming_the_path(tmp_path):
  ocp.PyTreeCheckpointer().save(tmp_path / 'other', make_blocks(depth=2))
  with pytest.raises(ValueError) as err:
    oneshot.prune_checkpoint(
      block_fn,
      tmp_path / 'other',
      tmp_path / 'out',
      calibration(),
      like=make_blocks(),
      method='wanda',
      sparsity=0.5,
    )
  message = str(err.value)
  assert '\n' not in message and 'holds another tree than like=' in message
  assert str(tmp_path / 'other') in message and 'give the checkpoint of this model' in message
  wider = make_blocks()
  wider[1]['up'] = np.zeros((WIDTH, 2 * HIDDEN), np.float32)
  ocp.PyTreeCheckpointer().save(tmp_path / 'wider', wider)
  with pytest.raises(
    ValueError,
    match=r"holds \[1\]\['up'\] of shape \(16, 64\) float32, the "
    r'model \(16, 32\) float32',
  ):
    oneshot.prune_checkpoint(
      block_fn,
      tmp_path / 'wider',
      tmp_path / 'out',
      calibration(),
      like=make_blocks(),
      method='wanda',
      sparsity=0.5,
    )
  assert not os.path.exists(tmp_path / 'out')


def test_bad_blocks_name_the_fix():
  with pytest.raises(ValueError, match='give a non-empty list of per-block params'):
    oneshot.prune_offloaded(block_fn, [], calibration(), method='wanda', sparsity=0.5)
  with pytest.raises(ValueError, match='leaves stacked along axis 0, one length'):
    oneshot.prune_offloaded(
      block_fn,
      {'a': np.zeros((2, 3)), 'b': np.zeros((3, 3))},
      calibration(),
      method='wanda',
      sparsity=0.5,
      stacked=True,
    )


def test_nothing_stays_on_the_device():
  """The pruned blocks come back as copies: no device array outlives the call (a numpy
  view of a CPU array would keep its device buffer, and every block, alive)."""

  def live():
    return sum(a.nbytes for a in {id(a): a for a in jax.live_arrays()}.values())

  blocks, batches = make_blocks(), calibration()
  before = live()
  pruned, masks = oneshot.prune_offloaded(block_fn, blocks, batches, method='wanda', nm='2:4')
  assert live() == before
  assert len(pruned) == len(masks) == DEPTH


def test_a_warning_of_every_block_is_given_once():
  with pytest.warns(UserWarning) as caught:
    oneshot.prune_offloaded(
      block_fn,
      make_blocks(),
      calibration(),
      method='magnitude',
      sparsity=0.5,
      overrides={'nothing': 0.3},
    )
  unmatched = [str(w.message) for w in caught if "'nothing'" in str(w.message)]
  assert len(unmatched) == 1  # not once per block (3 blocks)
  assert unmatched[0].startswith('prune_offloaded (first in block 0): ')


def test_every_option_the_offloaded_paths_share_with_prune_is_passed_on():
  """The offloaded paths hand `prune`'s options on by the names in one tuple: an option
  added to both signatures but not to the tuple would be dropped without a word."""
  import inspect

  from jaxprune.oneshot import _offload

  own = {'block_fn', 'blocks', 'calibration_inputs', 'fn', 'params', 'calibration_batches'}
  for path in (oneshot.prune_offloaded, oneshot.prune_checkpoint):
    shared = set(inspect.signature(path).parameters) & set(
      inspect.signature(oneshot.prune).parameters
    )
    assert shared - own == set(_offload._PASSED_ON), path.__name__
