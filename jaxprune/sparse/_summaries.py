"""Reading the masks of a sparse-training state, and applying them."""

from __future__ import annotations

from typing import Any

from jax import Array

from jaxprune import _summaries as summaries
from jaxprune._names import named_leaves
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


def get_masks(opt_state: PyTree) -> dict[str, Array]:
  """`{leaf name: bool mask}` of the sparse leaves (True = kept)."""
  masks = find_state(opt_state).masks
  return {name: mask for name, mask in named_leaves(masks) if mask is not None}


def apply_masks(params: PyTree, opt_state: PyTree) -> PyTree:
  """`params` with the entries outside the masks set to zero (e.g. right after `init`):
  `jaxprune.apply_masks` with the masks of the sparse state."""
  return summaries.apply_masks(params, find_state(opt_state).masks)
