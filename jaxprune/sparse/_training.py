"""Sparse training from scratch: static masks, SET and RigL, as optax wrappers.

Each wraps the optimizer, because RigL grows where the dense gradient is
largest and must reset the optimizer moments of the weights it grows:

    tx = jaxprune.sparse.rigl(optax.adam(1e-3), sparsity=0.9, distribution='erk',
                              update_freq=100, end_step=3000)

`tx.update(grads, state, params)` hands the optimizer the gradient masked by
the current mask (the gradient of the sparse model), and returns updates
after which, with `optax.apply_updates`, the weights outside the masks are
exactly zero. At a mask update (RigL, SET) it then drops the kept weights of
smallest magnitude after this step and grows as many: at random (SET, Mocanu
et al. 2018, Nature Communications 9:2383) or where the dense gradient is
largest (RigL, Evci et al. 2020, arXiv:1911.11134). Grown weights start at
exactly zero and every param-shaped leaf of the optimizer state (adam's `mu`
and `nu`, momentum) is zeroed at their positions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array, lax

from jaxprune._checks import check_fraction, need_params
from jaxprune._config.fields import DEFAULT_WEIGHT_NAME_REGEX
from jaxprune._meshes import on_any_mesh, sharded_like
from jaxprune._names import named_leaves
from jaxprune._transform import updates as updates_lib
from jaxprune.sparse import _distributions as distributions
from jaxprune.sparse import _select as select

PyTree = Any
RULES = ('static', 'set', 'rigl')


class SparseState(NamedTuple):
  """The state of `static`, `set_` and `rigl`: a pytree of arrays.

  Attributes:
    step: int32, the number of updates applied so far.
    key: uint32[2], the PRNG key of SET's random growth.
    masks: bool tree parallel to the params (True = kept), None for dense leaves.
    inner_state: the wrapped optimizer's state.
  """

  step: Array
  key: Array
  masks: PyTree
  inner_state: PyTree


def drop_fraction_at(
  step: Array, drop_fraction: float, begin_step: int, end_step: int, decay: str = 'cosine'
) -> Array:
  """RigL's drop fraction at `step`: `drop_fraction * (1 + cos(pi * p)) / 2`, p in [0, 1].

  `p` is the elapsed fraction of [begin_step, end_step]; `decay='constant'`
  keeps `drop_fraction` (SET's original rule).
  """
  if decay == 'constant':
    return jnp.float32(drop_fraction)
  progress = (jnp.asarray(step, jnp.float32) - begin_step) / (end_step - begin_step)
  progress = jnp.clip(progress, 0.0, 1.0)
  return jnp.float32(drop_fraction) * (1.0 + jnp.cos(jnp.float32(math.pi) * progress)) / 2.0


def reset_at(inner_state: PyTree, params: PyTree, grown: PyTree) -> PyTree:
  """`inner_state` with the entries at `grown` zeroed in every subtree shaped like `params`.

  `grown` is a bool tree parallel to `params` (None for leaves left alone).
  Subtrees are recognised by their tree structure and leaf shapes, as optax
  stores moments (`ScaleByAdamState.mu`, `.nu`, `TraceState.trace`).
  """
  structure = jax.tree.structure(params)
  shapes = [p.shape for p in jax.tree.leaves(params)]
  grown_leaves = jax.tree.leaves(grown, is_leaf=lambda x: x is None)

  def like_params(node):
    return (
      jax.tree.structure(node) == structure
      and [getattr(x, 'shape', None) for x in jax.tree.leaves(node)] == shapes
    )

  def reset(node):
    if not like_params(node):
      return node
    leaves = [
      x if g is None else updates_lib.zeroed(~g, x)
      for x, g in zip(jax.tree.leaves(node), grown_leaves, strict=True)
    ]
    return jax.tree.unflatten(structure, leaves)

  return jax.tree.map(reset, inner_state, is_leaf=like_params)


def check_inner(inner: Any, rule: str) -> None:
  """A TypeError unless `inner` is an optax transform (the optimizer the rule wraps)."""
  if not (callable(getattr(inner, 'init', None)) and callable(getattr(inner, 'update', None))):
    raise TypeError(
      f'jaxprune.sparse.{rule}: the first argument is the optimizer to wrap, '
      f'e.g. optax.adam(1e-3); got {inner!r}.'
    )


def check_like_params(rule: str, grads: PyTree, params: PyTree) -> None:
  """A ValueError naming the leaf when `grads` is not shaped like `params`."""
  if jax.tree.structure(grads) != jax.tree.structure(params):
    raise ValueError(
      f'jaxprune.sparse.{rule}: the gradients have another tree structure '
      f'than the params: {jax.tree.structure(grads)} vs '
      f'{jax.tree.structure(params)}.'
    )
  for (name, p), g in zip(named_leaves(params), jax.tree.leaves(grads), strict=True):
    if tuple(g.shape) != tuple(p.shape):
      raise ValueError(
        f'jaxprune.sparse.{rule}: the gradient of {name!r} has shape '
        f'{tuple(g.shape)}, the param {tuple(p.shape)}; pass the gradients '
        'of these params.'
      )


def sparse_training(
  inner: optax.GradientTransformation,
  sparsity: float,
  *,
  rule: str,
  distribution: str = 'uniform',
  sparsity_map: Mapping[str, float] | None = None,
  update_freq: int = 100,
  begin_step: int = 0,
  end_step: int | None = None,
  drop_fraction: float = 0.3,
  drop_fraction_decay: str = 'cosine',
  seed: int = 0,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: Callable[[str, Any], bool] | None = None,
  erk_power: float = 1.0,
) -> optax.GradientTransformation:
  """The common form of `static`, `set_` and `rigl` (see their docstrings); `rule` picks one.

  Mask updates happen at steps `begin_step + j * update_freq` (j >= 1) up to
  `end_step` included; none after it.
  """
  if rule not in RULES:
    raise ValueError(f'rule={rule!r}: use one of {RULES}.')
  check_inner(inner, rule)
  check_fraction('sparsity', sparsity, example='0.9')
  if distribution not in distributions.DISTRIBUTIONS:
    raise ValueError(f'distribution={distribution!r}: use one of {distributions.DISTRIBUTIONS}.')
  if rule != 'static':
    if end_step is None or end_step <= begin_step:
      raise ValueError(
        f'end_step={end_step!r}: {rule} needs the last step of mask updates, '
        f'after begin_step={begin_step}, e.g. 75% of the training steps.'
      )
    if not isinstance(update_freq, int) or update_freq < 1:
      raise ValueError(f'update_freq={update_freq!r}: must be an integer >= 1, e.g. 100.')
    check_fraction('drop_fraction', drop_fraction, example='0.3')
    if drop_fraction_decay not in ('cosine', 'constant'):
      raise ValueError(f"drop_fraction_decay={drop_fraction_decay!r}: use 'cosine' or 'constant'.")
  spread = distributions.Spread(
    sparsity, distribution, sparsity_map, weight_name_regex, prune_filter, erk_power
  )

  def counts(params, warn=False):
    """name -> kept count of each masked leaf (leaves at density 1 stay dense)."""
    density = spread.densities(params, warn=warn)
    sizes = {name: math.prod(leaf.shape) for name, leaf in named_leaves(params)}
    kept = {name: distributions.kept_count(sizes[name], d) for name, d in density.items()}
    return {name: k for name, k in kept.items() if k < sizes[name]}

  def init_fn(params):
    kept = counts(params, warn=True)
    key, state_key = jax.random.split(jax.random.PRNGKey(seed))
    masks = [
      None
      if name not in kept
      else select.random_mask(jax.random.fold_in(key, i), leaf.shape, kept[name])
      for i, (name, leaf) in enumerate(named_leaves(params))
    ]
    return SparseState(
      step=jnp.zeros((), jnp.int32),
      key=state_key,
      masks=jax.tree.unflatten(jax.tree.structure(params), masks),
      inner_state=inner.init(params),
    )

  def update_fn(grads, state, params=None):
    need_params(params, f'jaxprune.sparse.{rule}')
    check_like_params(rule, grads, params)
    kept = counts(params)
    names = [name for name, _ in named_leaves(params)]
    treedef = jax.tree.structure(params)
    p_leaves, g_leaves = jax.tree.leaves(params), jax.tree.leaves(grads)
    old = jax.tree.leaves(state.masks, is_leaf=lambda x: x is None)
    masked_grads = [
      g if m is None else updates_lib.zeroed(m, g) for g, m in zip(g_leaves, old, strict=True)
    ]
    updates, inner_state = inner.update(
      jax.tree.unflatten(treedef, masked_grads), state.inner_state, params
    )
    u_leaves = jax.tree.leaves(updates)
    key, step = state.key, state.step
    new, grown = old, [None] * len(old)
    if rule != 'static':
      key, subkey = jax.random.split(state.key)
      due = (step > begin_step) & (step <= end_step) & ((step - begin_step) % update_freq == 0)
      fraction = drop_fraction_at(step, drop_fraction, begin_step, end_step, drop_fraction_decay)

      def regrow(operands):
        (inner_state,) = operands
        masks = []
        for i, (name, m, p, u, g) in enumerate(
          zip(names, old, p_leaves, u_leaves, g_leaves, strict=True)
        ):
          if m is None:
            masks.append(None)
            continue
          max_drop = math.floor(kept[name] * drop_fraction)
          n_drop = jnp.minimum(
            jnp.floor(jnp.float32(kept[name]) * fraction).astype(jnp.int32), max_drop
          )
          grow_scores = (
            jnp.abs(g)
            if rule == 'rigl'
            else jax.random.uniform(jax.random.fold_in(subkey, i), m.shape)
          )
          regrown = functools.partial(select.drop_and_grow, max_drop=max_drop)
          magnitudes = jnp.abs(updates_lib.stored_weight(p, u))
          new_mask = on_any_mesh(regrown, sharded_like(m), m, magnitudes, grow_scores, n_drop)
          # NaN or Inf weights or gradients would break the counts: the leaf keeps its mask,
          # as the pruning transform skips such updates.
          finite = jnp.all(jnp.isfinite(magnitudes)) & jnp.all(jnp.isfinite(grow_scores))
          masks.append(jnp.where(finite, new_mask, m))
        grown = [None if n is None else n & ~m for n, m in zip(masks, old, strict=True)]
        return masks, reset_at(inner_state, params, jax.tree.unflatten(treedef, grown))

      new, inner_state = lax.cond(due, regrow, lambda operands: (old, operands[0]), (inner_state,))
      grown = [None if n is None else n & ~m for n, m in zip(new, old, strict=True)]
    out = [
      u if n is None else updates_lib.masked_update(n if g is None else n & ~g, u, p)
      for u, p, n, g in zip(u_leaves, p_leaves, new, grown, strict=True)
    ]
    return jax.tree.unflatten(treedef, out), SparseState(
      step=optax.safe_increment(step),
      key=key,
      masks=jax.tree.unflatten(treedef, new),
      inner_state=inner_state,
    )

  return optax.GradientTransformation(init_fn, update_fn)
