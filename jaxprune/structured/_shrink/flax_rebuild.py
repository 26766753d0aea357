"""Flax models at their pruned sizes: NNX updated in place, Linen resized.

Linen modules refuse parameters of another shape (`ScopeParamShapeError`), so
after pruning a Linen model needs modules with new `features`. Two ways:

* rebuild it yourself: read the new sizes with `linen_feature_sizes`, build the
  module with them, and check it with `check_linen_shapes` (it compares
  `jax.eval_shape(model.init, ...)` with the new variables);
* or run the unchanged module under `linen_resized(new_variables)`, which
  intercepts each Dense / DenseGeneral / Conv / ConvTranspose / Embed /
  MultiHeadDotProductAttention call and gives it the sizes its parameters have.

NNX modules take new arrays, but keep attributes (`in_features`,
`out_features`, `num_features`, `feature_group_count`, ...) that
`update_nnx_attributes` brings in line with the arrays.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

PyTree = Any


def _grouped(groups: int, old_out: int, new_out: int) -> int:
  """New `feature_group_count` of a grouped conv: whole groups went, each keeps its width."""
  if groups == 1:
    return 1
  per_group = old_out // groups
  if new_out % per_group:
    raise ValueError(
      f'grouped conv: {new_out} output features is not a multiple of the '
      f'{per_group} features per group; prune whole groups.'
    )
  return new_out // per_group


def _keep_scale(attention_fn: Callable[..., Any], head_dim: int) -> Callable[..., Any]:
  """`attention_fn` with queries scaled by 1/sqrt(head_dim) of the unpruned model.

  Flax's attention divides queries by sqrt(query.shape[-1]), which pruning
  head_dim changes; the dense model with those channels zeroed (what the
  pruned model must equal) keeps the original scale.
  """

  @functools.wraps(attention_fn)
  def attention(query, key, value, *args, **kwargs):
    query = query * jnp.sqrt(query.shape[-1] / head_dim).astype(query.dtype)
    return attention_fn(query, key, value, *args, **kwargs)

  attention.keeps_head_dim = head_dim
  return attention


def _scaled_attention(module: Any, old_head_dim: int, new_head_dim: int) -> None:
  """Keeps the unpruned attention scale of a module whose head_dim shrank."""
  fn = module.attention_fn
  if new_head_dim == old_head_dim or hasattr(fn, 'keeps_head_dim'):
    return  # a wrapped function already scales by the shape it is given
  if fn not in (nn.dot_product_attention, nnx.dot_product_attention):
    raise ValueError(
      f'{type(module).__name__}: head_dim was pruned from {old_head_dim} to '
      f"{new_head_dim} and its attention_fn {fn!r} is not Flax's "
      'dot_product_attention, so its scale cannot be kept; leave the head_dim '
      "groups out (Constraint(locked=('query',)))"
    )
  _set(module, attention_fn=_keep_scale(fn, old_head_dim))


def _set(module: Any, **attrs: Any) -> None:
  for name, value in attrs.items():
    object.__setattr__(module, name, value)


def _shape(variable: Any) -> tuple[int, ...]:
  return tuple(variable.shape)


def update_nnx_attributes(model: nnx.Module) -> nnx.Module:
  """Sets NNX size attributes from the current parameter shapes, in place.

  Handles Linear, LinearGeneral, Conv, ConvTranspose, BatchNorm, LayerNorm,
  RMSNorm, GroupNorm, Embed and MultiHeadAttention.

  Args:
    model: an NNX module whose arrays were replaced by smaller ones.

  Returns:
    The same model.
  """
  for _, module in nnx.iter_modules(model):
    if isinstance(module, (nnx.Conv, nnx.ConvTranspose)):
      kernel = _shape(module.kernel)
      groups = _grouped(module.feature_group_count, module.out_features, kernel[-1])
      _set(
        module,
        out_features=kernel[-1],
        feature_group_count=groups,
        in_features=kernel[-2] * groups if isinstance(module, nnx.Conv) else kernel[-2],
        kernel_shape=kernel,
      )
    elif isinstance(module, nnx.Linear):
      kernel = _shape(module.kernel)
      _set(module, in_features=kernel[0], out_features=kernel[1])
    elif isinstance(module, nnx.LinearGeneral):
      kernel = _shape(module.kernel)
      n_in = len(module.in_features)
      _set(module, in_features=kernel[:n_in], out_features=kernel[n_in:])
    elif isinstance(module, (nnx.BatchNorm, nnx.LayerNorm, nnx.RMSNorm, nnx.GroupNorm)):
      for name in ('scale', 'bias', 'mean', 'var'):
        variable = getattr(module, name, None)
        if variable is not None:
          _set(module, num_features=_shape(variable)[-1])
          break
    elif isinstance(module, nnx.Embed):
      num, features = _shape(module.embedding)
      _set(module, num_embeddings=num, features=features)
    elif isinstance(module, nnx.MultiHeadAttention):
      query, out = _shape(module.query.kernel), _shape(module.out.kernel)
      _scaled_attention(module, module.head_dim, query[2])
      _set(
        module,
        in_features=query[0],
        num_heads=query[1],
        head_dim=query[2],
        qkv_features=query[1] * query[2],
        out_features=out[-1],
        in_kv_features=_shape(module.key.kernel)[0],
      )
      if hasattr(module, 'num_kv_heads'):
        _set(module, num_kv_heads=_shape(module.key.kernel)[1])
  return model


def update_nnx(model: nnx.Module, new_state: PyTree) -> nnx.Module:
  """Puts pruned arrays into an NNX model and fixes its size attributes, in place.

  Args:
    model: the NNX model that was traced through `nnx.split(model)[1]`.
    new_state: `apply_plan`'s new variables for that state.

  Returns:
    The same model object, now at the pruned sizes.
  """
  nnx.update(model, new_state)
  return update_nnx_attributes(model)


def _params_at(params: PyTree, path: tuple[str, ...]) -> PyTree | None:
  node = params
  for key in path:
    if not isinstance(node, dict) or key not in node:
      return None
    node = node[key]
  return node


def _resize_linen(module: nn.Module, sub: PyTree, args: tuple) -> None:
  """Gives one Linen module the sizes of its parameters `sub`."""
  if isinstance(module, (nn.Conv, nn.ConvTranspose)) and 'kernel' in sub:
    kernel = _shape(sub['kernel'])
    groups = getattr(module, 'feature_group_count', 1)
    if groups > 1:
      _set(module, feature_group_count=_grouped(groups, module.features, kernel[-1]))
    _set(module, features=kernel[-1])
  elif isinstance(module, nn.Dense) and 'kernel' in sub:
    _set(module, features=_shape(sub['kernel'])[-1])
  elif isinstance(module, nn.DenseGeneral) and 'kernel' in sub:
    # The trailing axes: under `nn.scan` the params carry the layer axis in front.
    tupled = isinstance(module.features, tuple)
    features = _shape(sub['kernel'])[-len(module.features) if tupled else -1 :]
    _set(module, features=features if tupled else features[0])
  elif isinstance(module, nn.Embed) and 'embedding' in sub:
    num, features = _shape(sub['embedding'])[-2:]
    _set(module, num_embeddings=num, features=features)
  elif isinstance(module, nn.MultiHeadDotProductAttention) and 'query' in sub:
    query, out = _shape(sub['query']['kernel']), _shape(sub['out']['kernel'])
    qkv_features = module.qkv_features or (args[0].shape[-1] if args else None)
    if qkv_features is not None:
      _scaled_attention(module, qkv_features // module.num_heads, query[-1])
    _set(module, num_heads=query[-2], qkv_features=query[-2] * query[-1], out_features=out[-1])


@contextlib.contextmanager
def linen_resized(variables: PyTree) -> Iterator[None]:
  """Within this context, Linen modules take the sizes their parameters in `variables` have.

  Example::

    new_variables, _ = apply_plan(graph, variables, plan)
    with linen_resized(new_variables):
      logits = model.apply(new_variables, x)

  Args:
    variables: the pruned Linen variables (`{'params': ..., ...}`).
  """
  params = variables.get('params', variables) if isinstance(variables, dict) else variables

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if context.method_name == '__call__':
      sub = _params_at(params, tuple(module.path))
      if isinstance(sub, dict):
        _resize_linen(module, sub, args)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    yield


def linen_feature_sizes(variables: PyTree) -> dict[str, int | tuple[int, ...]]:
  """Output sizes of every kernel in Linen variables, by module path.

  Use them to construct the module at the pruned sizes; e.g. for a CNN whose
  widths are attributes: `CNN(widths=(sizes['Conv_0'], sizes['Conv_1']))`.

  Returns:
    `{'Conv_0': 16, 'Dense_0': 64, 'MultiHeadDotProductAttention_0/query': (4, 16), ...}`:
    the last axis of 2-d and conv kernels, the trailing feature axes of 3-d
    DenseGeneral kernels whose first axis is the input.
  """
  params = variables.get('params', variables)
  sizes = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [str(getattr(k, 'key', k)) for k in path]
    if keys[-1] != 'kernel':
      continue
    shape = _shape(leaf)
    module = '/'.join(keys[:-1])
    sizes[module] = (
      shape[1:] if len(shape) == 3 and keys[-2] in ('query', 'key', 'value') else shape[-1]
    )
  return sizes


def check_linen_shapes(model: nn.Module, variables: PyTree, *args: Any, **kwargs: Any) -> None:
  """Checks that `model.init` makes exactly the shapes of `variables` (no compute).

  Args:
    model: the rebuilt Linen module.
    variables: the pruned variables.
    *args: example inputs for `model.init`.
    **kwargs: keyword arguments for `model.init`.

  Raises:
    ValueError: listing every leaf whose shape differs or that is missing.
  """
  expected = jax.eval_shape(model.init, jax.random.key(0), *args, **kwargs)
  want = {
    '/'.join(str(getattr(k, 'key', k)) for k in p): tuple(x.shape)
    for p, x in jax.tree_util.tree_flatten_with_path(expected)[0]
  }
  have = {
    '/'.join(str(getattr(k, 'key', k)) for k in p): _shape(x)
    for p, x in jax.tree_util.tree_flatten_with_path(variables)[0]
  }
  wrong = [
    f'{name}: model makes {want.get(name)}, variables have {have.get(name)}'
    for name in sorted(set(want) | set(have))
    if want.get(name) != have.get(name)
  ]
  if wrong:
    raise ValueError(
      'rebuilt Linen model does not match the pruned variables:\n  ' + '\n  '.join(wrong)
    )
