"""Checks of `pruning`'s and `pruned`'s arguments, and of the trees each update is given
against the masks made at init: one rule and one message each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from jaxprune._names import leaf_name


def _is_transform(value: Any) -> bool:
  """An optax transform, or anything with its callable `init` and `update`."""
  return callable(getattr(value, 'init', None)) and callable(getattr(value, 'update', None))


def _named(value: Any) -> str:
  """`optax.adam` for optax's functions (defined in optax._src), else module.name."""
  module = getattr(value, '__module__', '') or ''
  name = getattr(value, '__qualname__', None) or repr(value)
  return f'optax.{name}' if module.startswith('optax') else f'{module}.{name}'.lstrip('.')


def _check_optimizer(where: str, optimizer: Any) -> None:
  if _is_transform(optimizer):
    return
  if isinstance(optimizer, (str, dict)) or hasattr(optimizer, 'target_sparsity'):
    raise TypeError(
      f'{where}: the first argument is the optimizer, and {optimizer!r} looks like hparams; '
      f'give the optimizer first: {where}(optax.adam(1e-3), hparams).'
    )
  if callable(optimizer):
    raise TypeError(
      f'{where}: optimizer={_named(optimizer)} is a function that makes an optax transform, '
      f'not one; call it: {where}({_named(optimizer)}(1e-3), target_sparsity=0.8).'
    )
  raise TypeError(
    f'{where}: optimizer={optimizer!r} must be an optax transform, e.g. '
    f'{where}(optax.adam(1e-3), target_sparsity=0.8); to prune what another transform '
    'produced, chain jaxprune.pruning(...) after it.'
  )


def _is_mask_rule(value: Any) -> bool:
  methods = ('check', 'init', 'new_masks')
  return not isinstance(value, type) and all(callable(getattr(value, m, None)) for m in methods)


def check_arguments(
  where: str, hparams: Any, sparsity_fn: Any, prune_filter: Any, mask_rule: Any, optimizer=None
) -> None:
  """The arguments of `jaxprune.pruning` and `pruned` (`optimizer`, its first) by kind, so
  that a factory, a transform where hparams go or a number where a function goes is one
  line naming the argument, the value and the right call; their values are checked later."""
  if where.endswith('pruned'):
    _check_optimizer(where, optimizer)
  if _is_transform(hparams):
    raise TypeError(
      f'{where}: hparams is an optax transform ({type(hparams).__name__}), not hparams. '
      'Give the hparams themselves, e.g. jaxprune.pruned(optax.adam(1e-3), '
      'target_sparsity=0.8), or chain the transforms: optax.chain(optax.adam(1e-3), '
      'jaxprune.pruning(target_sparsity=0.8)).'
    )
  if sparsity_fn is not None and not callable(sparsity_fn):
    raise TypeError(
      f'{where}: sparsity_fn={sparsity_fn!r} must be a function step -> sparsity, e.g. '
      'optax.linear_schedule(0.0, 0.8, 1000); a fixed target is '
      f'target_sparsity={sparsity_fn!r}.'
    )
  if prune_filter is not None and not callable(prune_filter):
    raise TypeError(
      f'{where}: prune_filter={prune_filter!r} must be a function (name, leaf) -> bool, e.g. '
      "lambda name, leaf: name.endswith('kernel'); a regex of leaf names is "
      f'weight_name_regex={prune_filter!r}.'
    )
  if mask_rule is not None and not _is_mask_rule(mask_rule):
    fix = (
      f'make one: mask_rule={mask_rule.__name__}(...)'
      if isinstance(mask_rule, type)
      else 'e.g. jaxprune.channels.ChannelRule(...)'
    )
    raise TypeError(
      f'{where}: mask_rule={mask_rule!r} must be a jaxprune.MaskRule (an object with check, '
      f'init and new_masks), {fix}; leave it out for the per-leaf magnitude rule.'
    )


def check_like_init(masks: Any, params: Any, updates: Any) -> None:
  """ValueErrors naming the leaf when params or updates do not match the masks init made
  (a tree parallel to the params, None for leaves not pruned)."""
  is_none = lambda x: x is None
  flat = jax.tree_util.tree_flatten_with_path(masks, is_leaf=is_none)[0]
  for what, tree in (('params', params), ('updates', updates)):
    if jax.tree.structure(tree) != jax.tree.structure(masks, is_leaf=is_none):
      wrapped = _one_level_apart(what, tree, masks)
      if wrapped:
        raise ValueError(f'jaxprune.pruning: {wrapped}')
      raise ValueError(
        f'jaxprune.pruning: the {what} tree has another structure than the params given to '
        f'init: {jax.tree.structure(tree)} vs {jax.tree.structure(masks, is_leaf=is_none)}.'
        ' Call init again with the new params.'
      )
    for (path, mask), leaf in zip(flat, jax.tree.leaves(tree), strict=True):
      if mask is not None and mask.shape != leaf.shape:
        raise ValueError(
          f'jaxprune.pruning: {what} leaf {leaf_name(path)!r} has shape {leaf.shape}, but '
          f'its mask from init has shape {mask.shape}. Call init again with the new params.'
        )


def _one_level_apart(what: str, tree: Any, masks: Any) -> str | None:
  """The error's text when `tree` is init's params wrapped one level deeper
  (`{'params': ...}`, as `jax.grad` of a function of Flax's variables gives) or one level
  less deep; None otherwise."""
  ref = jax.tree.structure(masks, is_leaf=lambda x: x is None)
  label, var = ('updates (the grads)', 'grads') if what == 'updates' else (what, what)
  if isinstance(tree, Mapping) and len(tree) == 1:
    [(key, inner)] = tree.items()
    if jax.tree.structure(inner) == ref:
      return (
        f'the {label} are wrapped in {{{key!r}: ...}}, one level deeper than the params '
        f'given to init; unwrap them ({var}[{key!r}]) or give init params wrapped the same '
        'way.'
      )
  if isinstance(masks, Mapping) and len(masks) == 1:
    [(key, inner)] = masks.items()
    if jax.tree.structure(tree) == jax.tree.structure(inner, is_leaf=lambda x: x is None):
      return (
        f'the params given to init are wrapped in {{{key!r}: ...}}, one level deeper than '
        f'the {what}; give init params[{key!r}], or wrap the {what} the same way.'
      )
  return None
