"""Which params leaves are matmul weights, read from the model's jaxpr: a `prune_filter`.

The rule is one-shot pruning's (`find_layers`, whose walk of the jaxpr this module
calls): a leaf is a weight when every use of it, after
relayouts and inside `jit`, remat and custom-derivative bodies, is one operand
of a `dot_general` with no batch dimensions or the kernel of a convolution; a
leaf a `lax.scan` takes as a scanned-over operand (Flax's `nn.scan`, penzai's
`LayerStack`) is one when its body uses each step's slice so. Any other use
(an embedding's gather, a norm's scale, a bias's add) leaves it out, and the
first such use is its reason.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._names import leaf_name
from jaxprune.oneshot import _inputs
from jaxprune.oneshot._layers import layers_and_reasons

PyTree = Any
_NOT_READ = 'not read by fn on the example arguments'
_SHOWN = 3  # reasons quoted in the error for a model with no weight


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: its fields are dicts
class MatmulWeights:
  """The matmul and convolution weights of a model: a `prune_filter` for
  `jaxprune.pruned`, `jaxprune.pruning` and `jaxprune.sparse`, made by `matmul_weights`.

  Called as `(name, leaf) -> bool`, it is True for the leaves in `names`. A name
  it did not read is matched to the one name it read that ends with `'/' + name`,
  so that the filter made from `{'params': ...}` variables serves the optimizer
  of `variables['params']`; a name matching none is an error.

  Attributes:
    names: the selected leaves' names (`jaxprune.leaf_name`), in flattening order.
    reasons: each other leaf's name and why it is left out, e.g.
      `{'embed/embedding': 'read by a gather, as an embedding lookup is'}`.
    stacked_axes: for each selected leaf stacked along a scan (one layer per
      step), the leaf's axis that indexes the layers (`layer_axes_map` gives them
      to the transform).
  """

  names: tuple[str, ...]
  reasons: Mapping[str, str]
  stacked_axes: Mapping[str, int]

  def __call__(self, name: str, leaf: Any) -> bool:
    """Whether the leaf `name` is one of the weights (`leaf` is not read)."""
    del leaf
    selected = set(self.names)
    if name in selected or name in self.reasons:
      return name in selected
    ends = [n for n in (*self.names, *self.reasons) if n.endswith('/' + name)]
    if len(ends) == 1:
      return ends[0] in selected
    known = (*self.names, *self.reasons)[:_SHOWN]
    raise ValueError(
      f'prune_filter: leaf {name!r} is not in the params that oneshot.matmul_weights read (whose '
      f'leaves are named like {list(known)}); pass matmul_weights the params tree the '
      'optimizer updates.'
    )

  @property
  def layer_axes_map(self) -> list[str]:
    """`layer_axes_map` entries (`'^name$:@axis'`) that give each layer of the stacked
    weights its own threshold and target, as if it were a leaf of its own:
    `jaxprune.pruned(..., prune_filter=weights, layer_axes_map=weights.layer_axes_map)`."""
    return [f'^{re.escape(name)}$:@{axis}' for name, axis in self.stacked_axes.items()]

  def __str__(self) -> str:
    width = max(map(len, (*self.names, *self.reasons)), default=0)
    lines = [f'{name:<{width}}  pruned' for name in self.names]
    lines += [f'{name:<{width}}  dense: {why}' for name, why in self.reasons.items()]
    return '\n'.join(lines)


def matmul_weights(fn: Callable[..., Any], params: PyTree, *example_args: Any) -> MatmulWeights:
  """The leaves of `params` that `fn` uses only as matmul or convolution weights.

  Traces `fn(params, *example_args)` once (`jax.make_jaxpr`, nothing is run) and
  selects each leaf that every use reads as one operand of a `dot_general` with
  no batch dimensions or as a convolution kernel: after casts and transposes,
  inside `jit`, remat and custom_jvp/custom_vjp bodies, and, for a leaf a
  `lax.scan` slices per step (Flax's `nn.scan` over layers, on any axis), each
  step's slice. This is the rule of one-shot pruning (docs/guides/oneshot.md),
  so the weights do not depend on what a library names them (`kernel`, `w`,
  `gating_einsum`, `weights/data_array`, `reverse_embeddings`). Left out, each
  with its reason in `.reasons`: leaves read by a gather (embeddings; a tied
  embedding, also read by the LM head's matmul, too), by elementwise operations
  (norms' scales, biases, gates), inside `while` or `cond`, as a scan's const or
  carry, not floating point, or not read at all.

  Args:
    fn: the model, called as `fn(params, *example_args)`; a Flax Linen module or its
      `apply` is called as `module.apply({'params': params}, *example_args)` (as
      `module.apply(params, ...)` when `params` holds a 'params' collection).
    params: the params as any pytree (a Linen dict, an NNX `State`, penzai's
      `{label: ParameterValue}`, a dict of keras variables' values); the filter
      selects by `jaxprune.leaf_name`, so give the tree the optimizer updates.
    *example_args: one batch of the model's inputs (arrays or shape/dtype structs).

  Returns:
    A `MatmulWeights`: pass it as `prune_filter`, e.g.
    `jaxprune.pruned(optax.adam(1e-3), target_sparsity=0.5,
    prune_filter=jaxprune.oneshot.matmul_weights(model.apply, params, batch))`;
    `print` it for a table of every leaf, pruned or dense and why.

  Raises:
    ValueError: when `fn` fails on these arguments, or reads no leaf as a weight.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxprune import oneshot
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.ones(3), 'scale': jnp.ones(4)}
    >>> weights = oneshot.matmul_weights(
    ...   lambda p, x: (x * p['scale']) @ p['w'] + p['b'], params, jnp.ones((2, 4)))
    >>> weights.names, weights.reasons['b']
    (('w',), 'read by add, not only as a matmul weight')
  """
  call = _inputs.model_function(fn, params)
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  names = [leaf_name(path) for path, _ in flat]
  try:
    closed = jax.make_jaxpr(lambda p, args: call(p, *args))(params, example_args)
  except Exception as err:  # the user's model failed on these arguments
    first = (str(err).strip().splitlines() or [''])[0]
    raise ValueError(
      f'oneshot.matmul_weights: fn(params, *example_args) raised {type(err).__name__}: '
      f'{first[:300]}. fn must run the model on the params given and one batch, e.g. '
      "matmul_weights(lambda p, x: model.apply({'params': p}, x), params, x)."
    ) from err
  layers, refused = layers_and_reasons(closed, names, batched=True)
  stacked = {layer.leaf: layer.stack.axis for layer in layers if layer.stack is not None}
  found = {layer.leaf for layer in layers}
  selected, reasons = [], {}
  for index, (name, (_, leaf)) in enumerate(zip(names, flat, strict=True)):
    dtype = np.dtype(getattr(leaf, 'dtype', np.asarray(leaf).dtype))
    if index not in found:
      reasons[name] = refused[index][0] if index in refused else _NOT_READ
    elif not jnp.issubdtype(dtype, jnp.floating):
      reasons[name] = f'dtype {dtype}: only floating-point weights are pruned'
    elif not np.prod(np.shape(leaf)):
      reasons[name] = 'has no elements'
    else:
      selected.append(index)
  if not selected:
    raise ValueError(_nothing_found(names, reasons))
  return MatmulWeights(
    names=tuple(names[i] for i in selected),
    reasons=reasons,
    stacked_axes={names[i]: stacked[i] for i in selected if i in stacked},
  )


def _nothing_found(names: list[str], reasons: Mapping[str, str]) -> str:
  """The one line for a model that reads no leaf as a weight, naming the likely fix."""
  read = [(name, why) for name, why in reasons.items() if why != _NOT_READ]
  if not read:
    return (
      f'oneshot.matmul_weights: fn reads none of the {len(names)} params leaves: did you pass the '
      'params the function uses? fn(params, *example_args) must compute with them, e.g. '
      "lambda p, x: model.apply({'params': p}, x), not with a model's own variables."
    )
  shown = '; '.join(f'{name!r}: {why}' for name, why in read[:_SHOWN])
  return (
    f'oneshot.matmul_weights: fn reads none of the {len(names)} params leaves as a matmul or '
    f'convolution weight ({shown}): did you pass the params the function uses? Else '
    'choose the leaves by name with prune_filter=lambda name, leaf: ...'
  )
