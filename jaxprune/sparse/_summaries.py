"""Reading the masks of a sparse-training state, and applying them."""

from __future__ import annotations

from typing import Any

from jaxprune import _warnings as warnings_lib
from jaxprune._results import summaries as summaries
from jaxprune.sparse._ste import STEState
from jaxprune.sparse._training import SparseState

PyTree = Any
_STATES = (SparseState, STEState)


def find_state(opt_state: PyTree) -> SparseState | STEState:
  """The one `SparseState` or `STEState` inside an optax state (or the state itself).

  Raises:
    ValueError: when there is none, or several (pass the one you mean).
  """
  return summaries.find_state(
    opt_state,
    _STATES,
    'jaxprune.sparse state (SparseState or STEState)',
    'pass the state of a jaxprune.sparse rule (its tx.init(params)), or the SparseState '
    'or STEState itself.',
  )


def get_masks(opt_state: PyTree) -> PyTree:
  """The masks of a sparse-training state, as a tree.

  Args:
    opt_state: a `SparseState` or `STEState`, or an optax state that holds one.

  Returns:
    The bool mask tree (True = kept), parallel to the params, None for the dense
    leaves: the shape `jaxprune.get_masks` returns, which `jaxprune.apply_masks`,
    `jaxprune.strip` and `jaxprune.size_report` take. `jaxprune.named_leaves(masks)`
    gives `(name, mask)` pairs of the sparse leaves.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxprune import sparse
    >>> params = {'Dense_0': {'kernel': jnp.ones((4, 4)), 'bias': jnp.ones(4)}}
    >>> masks = sparse.get_masks(sparse.static(optax.sgd(0.1), 0.75).init(params))
    >>> masks['Dense_0']['bias'] is None, int(masks['Dense_0']['kernel'].sum())
    (True, 4)
  """
  return _checked(opt_state).masks


def apply_masks(params: PyTree, opt_state: PyTree) -> PyTree:
  """`params` with the entries outside the masks set to zero (e.g. right after `init`):
  `jaxprune.apply_masks` with the masks of the sparse state."""
  return summaries.apply_masks(params, _checked(opt_state).masks)


def _checked(opt_state: PyTree) -> SparseState | STEState:
  """`find_state`, warning when STE's mask updates skipped leaves for NaN or Inf weights:
  those leaves keep their old masks (all kept, from init, when the first step was NaN)."""
  state = find_state(opt_state)
  skips = int(getattr(state, 'nonfinite_skips', 0))
  if skips:
    warnings_lib.warn(
      f'jaxprune.sparse.ste: {skips} leaf mask update(s) were skipped because the dense '
      'weights held NaN or Inf (NaN gradients?), so those leaves kept their old masks '
      '(dense from init, if from the first step); find the NaN (jax.config.update('
      "'jax_debug_nans', True)) or skip such steps (optax.apply_if_finite).",
    )
  return state
