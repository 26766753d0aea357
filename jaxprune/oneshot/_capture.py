"""Input statistics of chosen layers on calibration batches, one jitted pass per batch.

The model runs as traced, equation by equation (call bodies entered in place,
as `jaxprune.structured` runs them); at each `dot_general` that reads a chosen
layer, its input `x` is flattened to `(tokens, input channels)`, and at each
convolution that does, its input is unfolded into patches
(`lax.conv_general_dilated_patches`, one row per output position, ordered as
the kernel's `Layer.in_axes`), split by feature group. The rows are reduced on
the spot, inside `jit`: to `sum x_j^2` per input channel (Wanda) or to the
Gram matrix `X^T X` (SparseGPT, and the reconstruction error of the report), or to
`sum x_j` per input channel (DSnoT's means).
Only these reductions leave the jitted function, so a pass never holds more
than XLA needs for them, and the work after the last chosen layer is dead code
XLA drops.

A scan whose body reads chosen stacked layers runs as a `lax.scan` of the body
so interpreted; the statistics of the one step asked for (`at`, a traced index,
so that one compiled pass serves every step) are added up in its carry, inside
a `lax.cond` that computes them on that step only. A stack's statistics thus
take one slice's room, whatever its length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxprune.oneshot._layers import Layer, ScanKey
from jaxprune.structured._shared import call_body, conv_axes, scan_layout

Stats = dict[str, jax.Array]  # kind -> (groups, K) or (groups, K, K)
_HIGHEST = jax.lax.Precision.HIGHEST


def _rows(x: jax.Array, contracting: Sequence[int]) -> jax.Array:
  """`x` as float32 `(1, tokens, K)`: contracted axes last, in order, then flattened."""
  x = jnp.moveaxis(
    jnp.asarray(x, jnp.float32), tuple(contracting), tuple(range(x.ndim - len(contracting), x.ndim))
  )
  k = int(np.prod([x.shape[a] for a in range(x.ndim - len(contracting), x.ndim)]))
  return x.reshape(1, -1, k)


def patch_rows(eqn: Any, x: jax.Array, kernel_shape: Sequence[int]) -> jax.Array:
  """A convolution's input as float32 `(groups, tokens, K)`: row t of group g holds the
  inputs that output position t of group g's features multiplies with the kernel,
  ordered as the kernel's spatial axes, then its input features (`Layer.in_axes`)."""
  params = eqn.params
  axes = conv_axes(eqn)
  groups = params['feature_group_count']
  x = jnp.transpose(jnp.asarray(x, jnp.float32), axes.lhs_layout)  # (N, C, spatial...)
  window = tuple(kernel_shape[a] for a in axes.rhs_spatial)
  patches = jax.lax.conv_general_dilated_patches(
    x,
    window,
    params['window_strides'],
    params['padding'],
    lhs_dilation=params['lhs_dilation'],
    rhs_dilation=params['rhs_dilation'],
    precision=_HIGHEST,
  )  # (N, C * window, out...)
  channels = x.shape[1]
  patches = jnp.moveaxis(patches, 1, -1).reshape(-1, groups, channels // groups, *window)
  patches = jnp.moveaxis(patches, 2, -1)  # (tokens, G, window..., C/G)
  inputs = channels // groups * int(np.prod(window))  # explicit: there may be no tokens
  return jnp.moveaxis(patches, 1, 0).reshape(groups, patches.shape[0], inputs)


def _reduce(rows: jax.Array, kinds: Sequence[str]) -> Stats:
  out = {}
  if 'gram' in kinds:
    out['gram'] = jnp.matmul(jnp.swapaxes(rows, 1, 2), rows, precision=_HIGHEST)
  if 'sqnorm' in kinds:
    out['sqnorm'] = jnp.sum(rows * rows, axis=1)
  if 'sum' in kinds:
    out['sum'] = jnp.sum(rows, axis=1)
  return out


def stat_size(layers: Sequence[Layer], leaves: Sequence[Any], kinds: Sequence[str]) -> int:
  """Floats the statistics of `layers` take (a stack's: one slice's)."""
  total, seen = 0, set()
  for layer in layers:
    if layer.leaf in seen:
      continue
    seen.add(layer.leaf)
    k = int(np.prod([leaves[layer.leaf].shape[a] for a in layer.in_axes]))
    total += layer.groups * sum(k * k if kind == 'gram' else k for kind in kinds)
  return total


def _add(total: Any, part: tuple[Stats, int]) -> tuple[Stats, Any]:
  if total is None:
    return part
  return jax.tree.map(jnp.add, total[0], part[0]), total[1] + part[1]


def _bind(eqn: Any, invals: Sequence[Any]) -> list:
  """Runs one equation as traced."""
  with eqn.ctx.manager:
    out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
  return list(out) if eqn.primitive.multiple_results else [out]


class _Pass:
  """One traced run of the model that measures the chosen sites."""

  def __init__(
    self,
    by_site: Mapping[tuple, tuple[Layer, Any]],
    kinds: Sequence[str],
    at: Mapping[ScanKey, jax.Array],
  ):
    self.by_site, self.kinds, self.at = by_site, kinds, at

  def run(
    self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], scope: tuple, found: dict
  ) -> list:
    """Evaluates an open jaxpr; adds each chosen site's statistics to `found[leaf]`."""
    env: dict[Any, Any] = {}

    def read(v):
      return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for index, eqn in enumerate(jaxpr.eqns):
      invals = [read(v) for v in eqn.invars]
      body = call_body(eqn)
      if body is not None:
        outs = self.run(
          getattr(body, 'jaxpr', body),
          getattr(body, 'consts', ()),
          invals,
          scope + (index, 0),
          found,
        )
      elif (scope, index) in self.at:
        outs = self._scan(scope, index, eqn, invals, found)
      else:
        outs = _bind(eqn, invals)
      hit = self.by_site.get((scope, index))
      if hit is not None:
        layer, site = hit
        rows = (
          patch_rows(eqn, invals[0], eqn.invars[1].aval.shape)
          if site.conv
          else _rows(invals[site.operand], site.contracting)
        )
        found[layer.leaf] = _add(
          found.get(layer.leaf), (_reduce(rows, self.kinds), jnp.int32(rows.shape[1]))
        )
      for v, x in zip(eqn.outvars, outs, strict=True):
        if not isinstance(v, jcore.DropVar):
          env[v] = x
    return [read(v) for v in jaxpr.outvars]

  def _scan(self, scope: tuple, index: int, eqn: Any, invals: list, found: dict) -> list:
    """A scan whose body holds chosen sites: the statistics of step `at[scan]`, which
    reads slice `at[scan]` of its stacks, are added to `found`."""
    layout = scan_layout(eqn)
    sub = scope + (index, 0)
    body, target = layout.body, self.at[(scope, index)]
    consts, init = invals[: layout.n_consts], invals[layout.n_consts : layout.n_fixed]
    xs = invals[layout.n_fixed :]

    def step(carry, xs_t):
      local: dict = {}
      outs = self.run(body.jaxpr, body.consts, [*consts, *carry, *xs_t], sub, local)
      return outs, local

    def body_fn(carry, x):
      values, totals = carry
      i, xs_t = x
      outs, local = step(values, xs_t)
      totals = jax.lax.cond(
        i == target, lambda t, s: jax.tree.map(jnp.add, t, s), lambda t, s: t, totals, local
      )
      return (outs[: layout.n_carry], totals), outs[layout.n_carry :]

    example = jax.tree.map(lambda a: a[0], xs)
    zeros = jax.tree.map(
      lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(lambda: step(init, example)[1])
    )
    (carry, totals), ys = jax.lax.scan(
      body_fn,
      (list(init), zeros),
      (jnp.arange(layout.length), list(xs)),
      length=layout.length,
      reverse=layout.reverse,
      unroll=layout.unroll,
    )
    for leaf, part in totals.items():
      found[leaf] = _add(found.get(leaf), part)
    return [*carry, *ys]


def collector(closed: Any, layers: Sequence[Layer], kinds: Sequence[str]) -> Callable[..., dict]:
  """A function `(leaves, batches, at) -> {leaf: ({kind: sum over the batches and
  sites}, number of input rows)}` for `layers`, one jitted pass per batch.

  Args:
    closed: the ClosedJaxpr of `fn(params, batch)`.
    layers: the layers to measure.
    kinds: the reductions: 'gram' for `X^T X`, 'sqnorm' for the per-channel sum of
      squares, 'sum' for the per-channel sum, each with a leading axis of feature groups
      (1 for a matmul).

  The returned function's `at` maps a scan to the step whose stacked slices to
  measure (a stacked leaf's statistics are those of that slice; a scan not in it
  measures none).
  """
  by_site = {(site.scope, site.index): (layer, site) for layer in layers for site in layer.sites}
  scans = sorted({layer.stack.scan for layer in layers if layer.stack is not None})

  @jax.jit
  def run(flat, steps):
    found: dict[int, tuple[Stats, Any]] = {}
    _Pass(by_site, kinds, dict(zip(scans, steps, strict=True))).run(
      closed.jaxpr, closed.consts, flat, (), found
    )
    return found

  def collect(
    leaves: Sequence[Any], batches: Sequence[Any], at: Mapping[ScanKey, int] | None = None
  ) -> dict[int, tuple[Stats, int]]:
    steps = [jnp.int32(at.get(scan, -1) if at else -1) for scan in scans]
    totals: dict[int, tuple[Stats, int]] = {}
    for batch in batches:
      for leaf, (value, count) in run([*leaves, *jax.tree.leaves(batch)], steps).items():
        totals[leaf] = _add(totals.get(leaf), (value, int(count)))
    return totals

  return collect


def rounds(group: list[Layer]) -> Iterator[tuple[list[Layer], dict]]:
  """The layers of a wave in passes: each pass measures one step of each scan (`at`),
  the unstacked layers in the first."""
  steps: dict[Any, set[int]] = {}
  for layer in group:
    if layer.stack is not None:
      steps.setdefault(layer.stack.scan, set()).add(layer.stack.index)
  ordered = {scan: sorted(indices) for scan, indices in steps.items()}
  for r in range(max(map(len, ordered.values()), default=1)):
    at = {scan: indices[r] for scan, indices in ordered.items() if r < len(indices)}
    yield (
      [
        layer
        for layer in group
        if (layer.stack is None and r == 0)
        or (layer.stack is not None and at.get(layer.stack.scan) == layer.stack.index)
      ],
      at,
    )
