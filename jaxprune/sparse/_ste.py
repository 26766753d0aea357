"""Straight-through-estimator sparse training: forward on masked weights, dense updates.

The params the model sees are the masked weights, so the training step is an
ordinary one and its gradient (taken at the masked weights) is the
straight-through estimate for the dense weights (Bengio et al. 2013,
arXiv:1308.3432; for pruning Zhou et al. 2021, arXiv:2102.04010, whose SR-STE
this is with no decay). The state keeps the dense copy of each sparse leaf;
every `update_freq` steps the mask is recomputed from it, by magnitude or
N:M, so pruned weights can come back. The dense copy costs one params-sized
buffer per sparse leaf.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array, lax

from jaxprune._checks import need_params
from jaxprune._config.fields import DEFAULT_WEIGHT_NAME_REGEX
from jaxprune._masks import nm as nm_lib
from jaxprune._masks.update import update_mask
from jaxprune._meshes import on_any_mesh, sharded_like
from jaxprune._names import named_leaves
from jaxprune._transform import updates as updates_lib
from jaxprune.sparse import _distributions as distributions
from jaxprune.sparse._training import check_inner, check_like_params

PyTree = Any


class STEState(NamedTuple):
  """The state of `ste`.

  Attributes:
    step: int32, the number of updates applied so far.
    masks: bool tree parallel to the params, None for dense leaves.
    dense: the dense weights of the sparse leaves (None elsewhere); the params
      hold `where(mask, dense, 0)`.
    inner_state: the wrapped optimizer's state (its moments follow the dense weights).
    nonfinite_skips: int32, how many leaf mask updates were skipped because the leaf's
      dense weights held NaN or Inf (the leaf kept its mask); `sparse.get_masks` warns
      when it is nonzero.
  """

  step: Array
  masks: PyTree
  dense: PyTree
  inner_state: PyTree
  nonfinite_skips: Array


def ste(
  inner: optax.GradientTransformation,
  sparsity: float | None = None,
  *,
  nm: str | tuple[int, int] | None = None,
  update_freq: int = 1,
  distribution: str = 'uniform',
  sparsity_map: Mapping[str, float] | None = None,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: Callable[[str, Any], bool] | None = None,
) -> optax.GradientTransformation:
  """Sparse training with the straight-through estimator, by magnitude or N:M.

  At step 0 and then every `update_freq` steps, each sparse leaf's mask keeps
  its largest dense magnitudes (jaxprune's exact rule: the `round(n * (1 - s))`
  largest, `s` from `sparsity`, `distribution` and `sparsity_map`), or with
  `nm='2:4'` the 2 largest of every 4 along the input axis (`jaxprune.nm_mask`).
  The optimizer updates the dense weights with the gradient taken at the
  masked ones; the returned updates make the params equal to the new masked
  dense weights after `optax.apply_updates`, exactly.

  Args:
    inner: the optimizer.
    sparsity: the fraction of zeros over the sparse leaves, in [0, 1); 0.5 when neither
      it nor `nm` is given.
    nm: an N:M pattern, e.g. '2:4' (keep 2 of every 4).
    update_freq: steps between mask updates (1: every step, the usual STE).
    distribution, sparsity_map, weight_name_regex, prune_filter: as in `static`.

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`; its state is an
    `STEState`.
  """
  check_inner(inner, 'ste')
  pattern = nm_lib.parse_nm(nm)
  if pattern is not None and sparsity is not None:
    raise ValueError(
      f'jaxprune.sparse.ste: give a sparsity or an N:M pattern, not both '
      f'(sparsity={sparsity!r}, nm={nm!r}): N:M keeps N of every M.'
    )
  sparsity = 0.5 if sparsity is None else sparsity
  if not isinstance(update_freq, int) or update_freq < 1:
    raise ValueError(f'update_freq={update_freq!r}: must be an integer >= 1, e.g. 1.')
  spread = distributions.Spread(
    sparsity, distribution, sparsity_map, weight_name_regex, prune_filter, erk_power=1.0
  )

  def sparsities(params, warn=False):
    if pattern is not None:
      names = spread.names(params)
      return dict.fromkeys(names, 1.0 - pattern[0] / pattern[1])
    density = spread.densities(params, warn=warn)
    return {name: 1.0 - d for name, d in density.items() if d < 1.0}

  def new_mask(name, weights, target):
    if pattern is not None:
      return nm_lib.nm_mask(weights, *pattern, axis=-2, name=name)
    return update_mask(weights, jnp.float32(0), jnp.float32(target), threshold_method='exact')[1]

  def init_fn(params):
    targets = sparsities(params, warn=True)
    for name, leaf in named_leaves(params):
      if name in targets:  # a bad N:M shape fails now, not at step one
        jax.eval_shape(lambda w, n=name: new_mask(n, w, targets[n]), leaf)
    masks = [
      jnp.ones(leaf.shape, bool) if name in targets else None for name, leaf in named_leaves(params)
    ]
    dense = [leaf if name in targets else None for name, leaf in named_leaves(params)]
    treedef = jax.tree.structure(params)
    return STEState(
      step=jnp.zeros((), jnp.int32),
      masks=jax.tree.unflatten(treedef, masks),
      dense=jax.tree.unflatten(treedef, dense),
      inner_state=inner.init(params),
      nonfinite_skips=jnp.zeros((), jnp.int32),
    )

  def update_fn(grads, state, params=None):
    need_params(params, 'jaxprune.sparse.ste')
    check_like_params('ste', grads, params)
    targets = sparsities(params)
    names = [name for name, _ in named_leaves(params)]
    treedef = jax.tree.structure(params)
    p_leaves = jax.tree.leaves(params)
    is_none = lambda x: x is None  # noqa: E731
    old = jax.tree.leaves(state.masks, is_leaf=is_none)
    dense = [
      p if d is None else d
      for p, d in zip(p_leaves, jax.tree.leaves(state.dense, is_leaf=is_none), strict=True)
    ]
    updates, inner_state = inner.update(
      grads, state.inner_state, jax.tree.unflatten(treedef, dense)
    )
    u_leaves = jax.tree.leaves(updates)
    new_dense = [
      None if m is None else updates_lib.stored_weight(d, u)
      for m, d, u in zip(old, dense, u_leaves, strict=True)
    ]
    due = state.step % update_freq == 0

    def recompute(weights):
      # A leaf with NaN or Inf weights keeps its mask (its count would break), counted.
      finite = [None if w is None else jnp.all(jnp.isfinite(w)) for w in weights]
      masks = [
        None
        if w is None
        else jnp.where(
          ok,
          on_any_mesh(
            functools.partial(new_mask, n, target=targets[n]),
            sharded_like(w),
            w,
          ),
          m,
        )
        for n, w, m, ok in zip(names, weights, old, finite, strict=True)
      ]
      skips = sum((~ok).astype(jnp.int32) for ok in finite if ok is not None)
      return masks, jnp.int32(skips)

    new, skips = lax.cond(due, recompute, lambda _: (old, jnp.int32(0)), new_dense)
    # Kept before and after: params == dense, so adding `u` stores exactly the new dense
    # weight; newly kept: params are 0, and 0 + w is w.
    out = [
      u if n is None else updates_lib.masked_update(n, jnp.where(m, u, w), p)
      for u, p, m, n, w in zip(u_leaves, p_leaves, old, new, new_dense, strict=True)
    ]
    return jax.tree.unflatten(treedef, out), STEState(
      step=optax.safe_increment(state.step),
      masks=jax.tree.unflatten(treedef, new),
      dense=jax.tree.unflatten(treedef, new_dense),
      inner_state=inner_state,
      nonfinite_skips=state.nonfinite_skips + skips,
    )

  return optax.GradientTransformation(init_fn, update_fn)
