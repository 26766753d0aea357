"""The named sparse-training rules: `static`, `set_`, `rigl` (wrappers of `sparse_training`).

Each declares its own keywords and defaults, so that they show in its signature, and
hands them all to `sparse_training` by name: on a rule's first line, `locals()` holds
exactly its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

import optax

from jaxprune._config.fields import DEFAULT_WEIGHT_NAME_REGEX
from jaxprune._config.specs import PruneFilter
from jaxprune.sparse._training import sparse_training


def static(
  inner: optax.GradientTransformation,
  sparsity: float,
  *,
  distribution: str = 'uniform',
  sparsity_map: Mapping[str, float] | None = None,
  seed: int = 0,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: PruneFilter | None = None,
  erk_power: float = 1.0,
) -> optax.GradientTransformation:
  """Static sparse training: random masks drawn at `init`, never changed.

  The baseline of Evci et al. 2020 (arXiv:1911.11134, "Static"); with
  `distribution='erk'` the masks are random with ERK densities.

  Args:
    inner: the optimizer, e.g. `optax.adam(1e-3)`; it sees the masked gradient.
    sparsity: the fraction of zeros over the sparse leaves, in [0, 1).
    distribution: 'uniform' or 'erk' (Evci et al. 2020's Erdos-Renyi-Kernel).
    sparsity_map: `{regex: sparsity}` per-leaf overrides (taken out of the distribution).
    seed: seed of the random masks.
    weight_name_regex, prune_filter: which leaves are sparse (default: kernels and
      embeddings with 2 or more dimensions).
    erk_power: the ERK exponent (RigL's `erk_power_scale`).

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`; its state is a
    `SparseState`.
  """
  return sparse_training(**locals(), rule='static')


def set_(
  inner: optax.GradientTransformation,
  sparsity: float,
  *,
  end_step: int,
  update_freq: int = 100,
  begin_step: int = 0,
  drop_fraction: float = 0.3,
  drop_fraction_decay: str = 'cosine',
  distribution: str = 'uniform',
  sparsity_map: Mapping[str, float] | None = None,
  seed: int = 0,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: PruneFilter | None = None,
  erk_power: float = 1.0,
) -> optax.GradientTransformation:
  """Sparse Evolutionary Training (Mocanu et al. 2018): drop the smallest, regrow at random.

  Every `update_freq` steps after `begin_step` and up to `end_step`, each
  sparse leaf drops `floor(kept * f)` of its kept weights, those of smallest
  magnitude after this step, and grows as many among the others uniformly at
  random (a PRNG key in the state, split at every update). `f` decays from
  `drop_fraction` to 0 along a cosine over [begin_step, end_step]
  (`drop_fraction_decay='constant'` keeps it, as the SET paper did). Grown
  weights start at zero and their optimizer moments are reset.

  Args:
    inner: the optimizer.
    sparsity: the fraction of zeros over the sparse leaves, in [0, 1).
    end_step: the last step with a mask update.
    update_freq: steps between mask updates.
    begin_step: mask updates start after it.
    drop_fraction: the fraction of kept weights replaced at `begin_step`.
    drop_fraction_decay: 'cosine' (RigL's) or 'constant'.
    distribution, sparsity_map, seed, weight_name_regex, prune_filter, erk_power:
      as in `static` (the seed also drives the regrowth).

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.
  """
  return sparse_training(**locals(), rule='set')


def rigl(
  inner: optax.GradientTransformation,
  sparsity: float,
  *,
  end_step: int,
  update_freq: int = 100,
  begin_step: int = 0,
  drop_fraction: float = 0.3,
  drop_fraction_decay: str = 'cosine',
  distribution: str = 'erk',
  sparsity_map: Mapping[str, float] | None = None,
  seed: int = 0,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: PruneFilter | None = None,
  erk_power: float = 1.0,
) -> optax.GradientTransformation:
  """RigL (Evci et al. 2020, arXiv:1911.11134): drop the smallest, grow where |grad| is largest.

  As `set_`, except that the grown weights are those of largest dense-gradient
  magnitude (the gradient `tx.update` receives, before masking) and the
  default distribution is ERK, the paper's. Grown weights start at exactly
  zero and every param-shaped leaf of the optimizer state is zeroed at their
  positions; a weight dropped and grown again in one update keeps its value.

  Args:
    inner: the optimizer.
    sparsity: the fraction of zeros over the sparse leaves, in [0, 1).
    end_step: the last step with a mask update (the paper: 75% of training).
    update_freq: steps between mask updates (the paper: 100).
    begin_step: mask updates start after it.
    drop_fraction: the fraction of kept weights replaced at `begin_step` (the paper: 0.3).
    drop_fraction_decay: 'cosine' (the paper's) or 'constant'.
    distribution, sparsity_map, seed, weight_name_regex, prune_filter, erk_power:
      as in `static` (the seed draws the initial masks).

  Returns:
    An `optax.GradientTransformation` whose `update` needs `params`.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jaxprune import sparse
    >>> params = {'Dense_0': {'kernel': jax.random.normal(jax.random.key(0), (16, 8))}}
    >>> tx = sparse.rigl(optax.sgd(0.1), sparsity=0.75, end_step=100, update_freq=10)
    >>> state = tx.init(params)
    >>> params = sparse.apply_masks(params, state)  # sparse from step 0
    >>> int((params['Dense_0']['kernel'] != 0).sum())  # 25% of 128 kept
    32
  """
  return sparse_training(**locals(), rule='rigl')
