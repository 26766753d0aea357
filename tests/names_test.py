"""Leaf names: the key path joined with '/' (docs/explanation/semantics.md#names-and-maps)."""

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx

from jaxprune import _names as names


class _Pair(NamedTuple):
  first: object
  second: object


def test_names_of_dicts_sequences_and_attributes():
  tree = {'enc': [{'kernel': 1}, _Pair(first=2, second={'w': 3})]}
  assert names.named_leaves(tree) == [
    ('enc/0/kernel', 1),
    ('enc/1/first', 2),
    ('enc/1/second/w', 3),
  ]
  assert names.tree_names(tree) == {
    'enc': [{'kernel': 'enc/0/kernel'}, _Pair('enc/1/first', {'w': 'enc/1/second/w'})]
  }


def test_nnx_variables_drop_their_value_key():
  class Model(nnx.Module):
    def __init__(self):
      self.linear1 = nnx.Linear(2, 3, rngs=nnx.Rngs(0))

  state = nnx.state(Model(), nnx.Param)
  assert sorted(n for n, _ in names.named_leaves(state)) == ['linear1/bias', 'linear1/kernel']


def test_a_lone_value_key_is_kept():
  assert names.named_leaves({'value': jnp.zeros(1)})[0][0] == 'value'
