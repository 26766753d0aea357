"""One small plain function per channel rule that no layer model reaches.

Each case is `(fn, params, example_args, description)` like the cases of
`structured_zoo`; its groups are worked out by hand in
`structured_trace_primitives_test.py`. Most have two paths: `w1 -> w2`,
where the primitive passes channels through (prunable), and `w3 -> w4`,
where it mixes or splits the channel axis (blocked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name


def _params(**shapes):
  rng = np.random.default_rng(3)
  return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def _x(*shape):
  return jnp.asarray(np.random.default_rng(4).normal(size=shape).astype(np.float32))


def rev():
  """`jnp.flip` of the channel axis: channel c of w1 meets row 7 - c of w2."""
  fn = lambda p, x: jnp.flip(jnp.tanh(x @ p['w1']), axis=-1) @ p['w2']
  return fn, _params(w1=(5, 8), w2=(8, 3)), (_x(2, 5),), 'rev (jnp.flip) of the channel axis'


def iota():
  """`jnp.arange` is a constant: multiplying by it ties nothing, it is cut per use."""
  fn = lambda p, x: ((x @ p['w1']) * jnp.arange(1.0, 9.0)) @ p['w2']
  return fn, _params(w1=(5, 8), w2=(8, 3)), (_x(2, 5),), 'iota (jnp.arange) scaling channels'


def dynamic_update_slice():
  """Whole rows written into a zero buffer keep their channels; a part of an axis blocks."""

  def fn(p, x):
    rows = jax.lax.dynamic_update_slice(jnp.zeros((4, 8)), x @ p['w1'], (1, 0))
    cols = jax.lax.dynamic_update_slice(jnp.zeros((2, 12)), x @ p['w3'], (0, 2))
    return rows.sum(0) @ p['w2'] + cols @ p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w3=(5, 8), w4=(12, 3))
  return fn, params, (_x(2, 5),), 'dynamic_update_slice of whole and of partial channel axes'


def scatter_add():
  """Rows added at indexed positions keep their channels (a mixture of experts' combine);
  a window narrower than its axis blocks."""

  def fn(p, x):
    rows = jnp.zeros((4, 8)).at[jnp.array([3, 1])].add(x @ p['w1'])
    cols = jnp.zeros((2, 12)).at[:, 2:10].add(x @ p['w3'])
    return rows.sum(0) @ p['w2'] + cols @ p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w3=(5, 8), w4=(12, 3))
  return fn, params, (_x(2, 5),), 'scatter-add of whole and of partial channel axes'


def reduce_window():
  """Max and average pooling: windows block the spatial axes, channels pass."""

  def fn(p, x):
    h = x @ p['w1']  # (2, 4, 4, 8)
    pooled = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), 'VALID')
    pooled = jax.lax.reduce_window(pooled, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), 'VALID')
    return pooled[:, 0, 0] @ p['w2']

  return fn, _params(w1=(3, 8), w2=(8, 3)), (_x(2, 4, 4, 3),), 'max pool then sum pool'


def bitcast():
  """Same-width bitcasts are elementwise; to a narrower type they split each entry."""

  def fn(p, x):
    same = jax.lax.bitcast_convert_type(
      jax.lax.bitcast_convert_type(x @ p['w1'], jnp.int32), jnp.float32
    )
    split = jax.lax.bitcast_convert_type(
      jax.lax.bitcast_convert_type(x @ p['w3'], jnp.uint16), jnp.float32
    )
    return same @ p['w2'] + split @ p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w3=(5, 8), w4=(8, 3))
  return fn, params, (_x(2, 5),), 'bitcast_convert_type to int32 and to uint16 and back'


def top_k():
  """top_k over the batch keeps channels; over the channels blocks them."""

  def fn(p, x):
    best, _ = jax.lax.top_k(x @ p['w1'], 1, axis=0)  # (1, 8): the largest row entry
    top3, _ = jax.lax.top_k(x @ p['w3'], 3)  # (2, 3): 3 largest channels
    return best @ p['w2'] + top3.sum(1, keepdims=True) * p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w3=(5, 8), w4=(1, 3))
  return fn, params, (_x(2, 5),), 'top_k over the batch axis and over the channel axis'


def argmax():
  """argmax over the batch keeps channels (its index output); over channels blocks them."""

  def fn(p, x):
    h = x @ p['w1']
    winner = jnp.argmax(h, axis=0).astype(jnp.float32)  # (8,)
    choice = jnp.argmax(x @ p['w3'], axis=1).astype(jnp.float32)[:, None]  # (2, 1)
    return (h * winner) @ p['w2'] + choice * p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w3=(5, 8), w4=(1, 3))
  return fn, params, (_x(2, 5),), 'argmax over the batch axis and over the channel axis'


def unstack():
  """Unstacking the batch axis keeps channels; unstacking channels blocks them."""

  def fn(p, x):
    first, second = jnp.unstack(x @ p['w1'], axis=0)  # two rows of 8 channels
    pieces = jnp.unstack(x @ p['w3'], axis=1)  # 4 columns of the batch
    return first @ p['w2'] + second @ p['w2b'] + sum(pieces)[:, None] * p['w4']

  params = _params(w1=(5, 8), w2=(8, 3), w2b=(8, 3), w3=(5, 4), w4=(1, 3))
  return fn, params, (_x(2, 5),), 'unstack of the batch axis and of the channel axis'


def psum():
  """A batch mean through `vmap(..., axis_name)` (equinox's BatchNorm): channels pass."""

  def fn(p, x):
    def one(row):
      h = row @ p['w1']
      return (h - jax.lax.pmean(h, 'batch')) @ p['w2']

    return jax.vmap(one, axis_name='batch')(x)

  return fn, _params(w1=(5, 8), w2=(8, 3)), (_x(2, 5),), 'psum over a vmap axis (batch mean)'


def identities():
  """What JAX LLM code wraps activations in (MaxText's `checkpoint_name`, barriers, copies):
  identities, so channels pass as if they were not there."""

  def fn(p, x):
    h = checkpoint_name(x @ p['w1'], 'mlpwi')
    h = jnp.copy(jax.lax.optimization_barrier(h))
    return jnp.tanh(h) @ p['w2']

  return fn, _params(w1=(5, 8), w2=(8, 3)), (_x(2, 5),), 'checkpoint_name, barrier and copy'


CASES = {
  f.__name__: f
  for f in (
    rev,
    iota,
    dynamic_update_slice,
    scatter_add,
    reduce_window,
    bitcast,
    top_k,
    argmax,
    unstack,
    psum,
    identities,
  )
}
