"""Export a pruned model for the size win: dense params with zeros, BCOO leaves, a size report.

Pruning alone does not make a model smaller: the params keep their dense shape
with zeros in them (tfmot users' most common surprise). This module

- `strip`s the masks: params with the pruned entries set to zero, masks dropped;
- converts the pruned leaves `to_bcoo` (`jax.experimental.sparse.BCOO`), which
  stores only the kept values plus their indices;
- reports the sizes (`size_report`, in `jaxprune._results.sizes`): dense bytes, sparse
  bytes with the index overhead, and bytes after zlib compression of the stripped params;
- runs a model on the sparse params (`sparse_apply`, via `sparsify`) and
  checks that it gives the outputs of the dense one (`check_sparse_outputs`).

Each takes `names=`, a regex searched in the leaf names (`'fc1/kernel'`), restricting
what it acts on; one that matches no leaf is an error. `sparsify` has no rule for a
convolution with a BCOO kernel: `sparse_apply` runs such kernels dense, and says so once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxprune import _warnings as warnings_lib
from jaxprune._names import leaf_name
from jaxprune._results.summaries import apply_masks, contains_pruning_state, get_masks

__all__ = [
  'OutputMismatchError',
  'check_sparse_outputs',
  'densify',
  'sparse_apply',
  'strip',
  'to_bcoo',
]

PyTree = Any


def _is_none(x: Any) -> bool:
  return x is None


# `jax.experimental.sparse` is imported where it is used: it loads scipy, which
# `import jaxprune` does not need.
def is_bcoo(x: Any) -> bool:
  from jax.experimental import sparse

  return isinstance(x, sparse.BCOO)


def _mask_leaves(params: PyTree, masks: Any) -> list[Any]:
  """The masks as a list parallel to params' leaves (None where a leaf has none).

  `masks` is a mask tree, a `PruningState`, or an optax state containing one.
  """
  if contains_pruning_state(masks):
    masks = get_masks(masks)
  params_def = jax.tree_util.tree_structure(params, is_leaf=_is_none)
  leaves, treedef = jax.tree_util.tree_flatten(masks, is_leaf=_is_none)
  if treedef != params_def:
    raise ValueError(
      'masks must be a tree parallel to params (None for unpruned leaves), a '
      f'PruningState, or an optax state containing one; got structure {treedef}, '
      f'params have {params_def}'
    )
  return leaves


def strip(params: PyTree, masks: Any, *, names: str | None = None) -> PyTree:
  """Returns params with every masked-out entry set to zero; the masks are dropped.

  The same as `jaxprune.apply_masks`, under the name tfmot users know.

  Args:
    params: a pytree of arrays.
    masks: a mask tree parallel to params (bool, None for unpruned leaves), a
      `PruningState`, or an optax state containing one.
    names: optional regex (re.search on the leaf name, e.g. 'fc1/kernel') restricting
      which masked leaves are stripped; the others are returned as they are.

  Returns:
    A pytree like params (same shapes and dtypes) with zeros where the masks
    are False. Leaves without a mask are returned as they are.

  Raises:
    ValueError: if the masks are not parallel to params, a mask's shape differs
      from its leaf's, or `names` matches none of the masked leaves.

  Example:
    >>> import jax.numpy as jnp, jaxprune
    >>> params = {'Dense_0': {'kernel': jnp.array([[1., 2.], [3., 4.]])}}
    >>> masks = {'Dense_0': {'kernel': jnp.array([[True, False], [False, True]])}}
    >>> jaxprune.strip(params, masks)['Dense_0']['kernel']
    Array([[1., 0.],
           [0., 4.]], dtype=float32)
  """
  if names is None:
    return apply_masks(params, masks)
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_none)[0]]
  mask_leaves = _mask_leaves(params, masks)
  chosen = _matching(
    'strip',
    names,
    [leaf_name(p) if m is not None else None for p, m in zip(paths, mask_leaves, strict=True)],
  )
  kept = [m if c else None for m, c in zip(mask_leaves, chosen, strict=True)]
  treedef = jax.tree_util.tree_structure(params, is_leaf=_is_none)
  return apply_masks(params, jax.tree_util.tree_unflatten(treedef, kept))


def _matching(where: str, names: str, candidates: list[str | None]) -> list[bool]:
  """Per leaf, whether `names` is found in its name (None: not a candidate); a ValueError
  naming the candidates when it is found in none of them."""
  pattern = re.compile(names)
  chosen = [name is not None and pattern.search(name) is not None for name in candidates]
  listed = [name for name in candidates if name is not None]
  if listed and not any(chosen):
    shown = ', '.join(repr(n) for n in listed[:6]) + (', ...' if len(listed) > 6 else '')
    raise ValueError(
      f'{where}: names={names!r} matches none of the leaves it would act on ({shown}); '
      f'names is a regex searched in these names, e.g. names={listed[0].split("/")[0]!r}.'
    )
  return chosen


def _to_convert(
  params: PyTree, masks: Any, names: str | None, where: str = 'to_bcoo'
) -> tuple[PyTree, list[bool]]:
  """Stripped params and, per leaf, whether it becomes sparse."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_none)
  if masks is None:
    stripped = params
    convert = [leaf is not None and jnp.ndim(leaf) >= 2 for _, leaf in leaves]
  else:
    stripped = strip(params, masks)
    convert = [mask is not None for mask in _mask_leaves(params, masks)]
  if names is not None:
    convert = _matching(
      where,
      names,
      [leaf_name(path) if c else None for c, (path, _) in zip(convert, leaves, strict=True)],
    )
  return stripped, convert


def to_bcoo(
  params: PyTree, masks: Any = None, *, names: str | None = None, index_dtype: Any = jnp.int32
) -> PyTree:
  """Converts the pruned leaves to `jax.experimental.sparse.BCOO`.

  Each converted leaf stores its nonzero entries only (`nse` of them) and
  their indices, `(nse, ndim)` of `index_dtype`. Not jittable (`nse` depends
  on the values).

  Args:
    params: a pytree of arrays (already pruned, or pruned by `masks`).
    masks: optional mask tree / `PruningState` / optax state; when given, the
      leaves with a mask are stripped and converted, otherwise every leaf with
      at least 2 dimensions is.
    names: optional regex (re.search on the leaf name, e.g. 'fc1/kernel')
      restricting which of those leaves are converted; one that matches none of
      them is an error naming them.
    index_dtype: dtype of the BCOO indices.

  Returns:
    A pytree like params with BCOO leaves in place of the converted ones.
  """
  return convert_to_bcoo(params, masks, names, index_dtype, 'to_bcoo')


def convert_to_bcoo(params: PyTree, masks: Any, names: str | None, index_dtype: Any, where: str):
  from jax.experimental import sparse

  stripped, convert = _to_convert(params, masks, names, where)
  leaves, treedef = jax.tree_util.tree_flatten(stripped, is_leaf=_is_none)
  out = [
    sparse.BCOO.fromdense(leaf, index_dtype=index_dtype) if c else leaf
    for leaf, c in zip(leaves, convert, strict=True)
  ]
  return jax.tree_util.tree_unflatten(treedef, out)


def densify(sparse_params: PyTree) -> PyTree:
  """Turns every BCOO leaf back into a dense array."""
  return jax.tree.map(lambda x: x.todense() if is_bcoo(x) else x, sparse_params, is_leaf=is_bcoo)


def sparse_apply(fn: Callable[..., Any], *, names: str | None = None) -> Callable[..., Any]:
  """Wraps `fn(params, *args)` so that it runs on params with BCOO leaves.

  Uses `jax.experimental.sparse.sparsify` (its tracer implementation, which
  handles `custom_jvp` functions such as `nn.relu`; the default one fails on
  them in jax 0.10). Matrix products with a BCOO operand become
  `bcoo_dot_general`, so Flax `Dense`/`DenseGeneral`/`Einsum` layers compute
  sparsely. Convolutions have no sparse rule: a BCOO leaf that is a convolution's
  kernel is made dense for the call (a warning names such kernels once).
  The result can be wrapped in `jax.jit`.

  Args:
    fn: a function of params (or variables) and inputs, e.g.
      `lambda p, x: model.apply({'params': p}, x)`.
    names: optional regex (re.search on the leaf name): the BCOO leaves it does not
      match run dense; one that matches none of them is an error naming them.

  Returns:
    A function with the same signature accepting BCOO leaves.
  """
  from jax.experimental import sparse

  sparse_fn = sparse.sparsify(fn, use_tracer=True)

  def apply(sparse_params: PyTree, *args: Any) -> Any:
    flat, treedef = jax.tree_util.tree_flatten_with_path(sparse_params, is_leaf=is_bcoo)
    leaves = [leaf for _, leaf in flat]
    names_of = [leaf_name(path) for path, _ in flat]
    stays = [is_bcoo(leaf) for leaf in leaves]
    if names is not None:
      candidates = [n if s else None for n, s in zip(names_of, stays, strict=True)]
      stays = _matching('sparse_apply', names, candidates)
    # A convolution's kernel has 3 or more axes: with none such, no trace is needed.
    convs = set()
    if any(s and leaf.ndim >= 3 for s, leaf in zip(stays, leaves, strict=True)):
      convs = _conv_kernels(fn, treedef, leaves, args)
    dense_convs = [n for i, n in enumerate(names_of) if stays[i] and i in convs]
    _warn_dense_convs(dense_convs)
    stays = [s and i not in convs for i, s in enumerate(stays)]
    leaves = [x if s or not is_bcoo(x) else x.todense() for x, s in zip(leaves, stays, strict=True)]
    return sparse_fn(jax.tree_util.tree_unflatten(treedef, leaves), *args)

  return apply


# The kernels `sparse_apply` has said it runs dense, so that each is named once.
_WARNED_CONVS: set[str] = set()


def _warn_dense_convs(kernels: list[str]) -> None:
  new = [name for name in kernels if name not in _WARNED_CONVS]
  if new:
    _WARNED_CONVS.update(new)
    warnings_lib.warn(
      'jaxprune.sparse_apply: jax.experimental.sparse has no rule for a convolution with a '
      f'BCOO kernel, so these kernels run dense: {", ".join(new)} (stored as BCOO all the '
      'same; the other BCOO leaves run sparse).'
    )


# Operations a kernel may pass through on its way into a convolution (Flax casts it).
_PASS_THROUGH = ('convert_element_type', 'copy', 'copy_p', 'reshape', 'transpose', 'squeeze')


def _conv_kernels(fn: Callable[..., Any], treedef: Any, leaves: list[Any], args: tuple) -> set:
  """Indices of the leaves that reach a convolution's kernel operand in `fn`'s jaxpr."""
  avals = [jax.ShapeDtypeStruct(jnp.shape(x), x.dtype) for x in leaves]
  closed = jax.make_jaxpr(lambda p: fn(p, *args))(jax.tree_util.tree_unflatten(treedef, avals))
  found: set[int] = set()
  _walk(closed.jaxpr, dict(zip(closed.jaxpr.invars, range(len(leaves)), strict=True)), found)
  return found


def _walk(jaxpr: Any, origin: dict, found: set) -> None:
  """Follows each leaf's variable (`origin`: var -> leaf index) through `jaxpr`."""
  for eqn in jaxpr.eqns:
    ins = [origin.get(v) if not isinstance(v, jcore.Literal) else None for v in eqn.invars]
    if eqn.primitive.name == 'conv_general_dilated' and ins[1] is not None:
      found.add(ins[1])
    elif eqn.primitive.name in _PASS_THROUGH and ins[0] is not None:
      origin[eqn.outvars[0]] = ins[0]
    for sub in _sub_jaxprs(eqn):
      inner = sub.invars[len(sub.invars) - len(ins) :]
      _walk(sub, {v: i for v, i in zip(inner, ins, strict=True) if i is not None}, found)


def _sub_jaxprs(eqn: Any) -> list[Any]:
  """The jaxprs an equation calls whose inputs are its operands (pjit, custom_jvp, ...)."""
  subs = []
  for key in ('jaxpr', 'call_jaxpr', 'fun_jaxpr'):
    sub = eqn.params.get(key)
    sub = getattr(sub, 'jaxpr', sub)
    if sub is not None and hasattr(sub, 'eqns') and len(sub.invars) >= len(eqn.invars):
      subs.append(sub)
  return subs


class OutputMismatchError(Exception):
  """The sparse model's outputs differ from the dense model's beyond the tolerance.

  Attributes:
    max_difference: the largest absolute difference of an output that failed.
    rtol, atol: the tolerances it was checked with.
  """

  def __init__(self, max_difference: float, rtol: float, atol: float):
    super().__init__(
      f'sparse and dense outputs differ by up to {max_difference:.3g} '
      f'(rtol={rtol}, atol={atol}); a sparse rule changed the computation, '
      'or the tolerance is too tight for its summation order'
    )
    self.max_difference, self.rtol, self.atol = max_difference, rtol, atol


def check_sparse_outputs(
  fn: Callable[..., Any],
  params: PyTree,
  masks: Any,
  *args: Any,
  rtol: float | None = None,
  atol: float | None = None,
  names: str | None = None,
) -> float:
  """Checks that `fn` on sparse params gives the outputs of `fn` on the stripped dense ones.

  The sparse params are `to_bcoo(params, masks, names=names)`, run by `sparse_apply`
  (a convolution's kernel dense, said once in a warning).

  Args:
    fn: `fn(params, *args)`, e.g. `lambda p, x: model.apply({'params': p}, x)`.
    params: a pytree of arrays.
    masks: mask tree / `PruningState` / optax state, or None if the params
      are already pruned.
    *args: example inputs.
    rtol: relative tolerance (summation order differs between the sparse and
      the dense product). None: 1e-5, or for an output narrower than float32
      (bfloat16, float16) 4 units of its rounding (4 times its dtype's eps).
    atol: absolute tolerance. None: 1e-5, or for a lower-precision output the same
      units of its rounding times its largest |value| (one rounding of a sum of
      large terms can land on a small output).
    names: optional regex restricting which leaves are converted (see `to_bcoo`).

  Returns:
    The largest absolute difference over all outputs.

  Raises:
    OutputMismatchError: if some output differs by more than `atol + rtol * |dense|`.
  """
  dense_params = params if masks is None else strip(params, masks)
  dense_out = fn(dense_params, *args)
  sparse_out = sparse_apply(fn)(
    convert_to_bcoo(params, masks, names, jnp.int32, 'check_sparse_outputs'), *args
  )
  worst = 0.0
  for d, s in zip(jax.tree.leaves(dense_out), jax.tree.leaves(sparse_out), strict=True):
    leaf_rtol, leaf_atol = _tolerances(np.asarray(d), rtol, atol)
    d, s = np.asarray(d, np.float64), np.asarray(s, np.float64)
    if d.size:
      worst = max(worst, float(np.max(np.abs(d - s))))
    if not np.allclose(s, d, rtol=leaf_rtol, atol=leaf_atol):
      raise OutputMismatchError(float(np.max(np.abs(d - s))), leaf_rtol, leaf_atol)
  return worst


# Rounding units of a bfloat16 or float16 output the sparse and the dense model may differ
# by: each rounds its own sum once more (measured up to 1 unit on a 6 -> 8 -> 4 MLP).
_LOW_PRECISION_ULPS = 4


def _tolerances(output: np.ndarray, rtol: float | None, atol: float | None) -> tuple[float, float]:
  """The (rtol, atol) one output is checked with: the given ones, else by its dtype."""
  low = jnp.issubdtype(output.dtype, jnp.inexact) and jnp.finfo(output.dtype).bits < 32
  if not low:
    return 1e-5 if rtol is None else rtol, 1e-5 if atol is None else atol
  unit = _LOW_PRECISION_ULPS * float(jnp.finfo(output.dtype).eps)
  scale = float(np.max(np.abs(np.asarray(output, np.float64)), initial=0.0))
  return unit if rtol is None else rtol, unit * scale if atol is None else atol
