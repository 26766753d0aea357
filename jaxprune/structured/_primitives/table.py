"""The one table of primitives the structured pass knows.

Each entry says, for one primitive (`eqn.primitive.name`):

  trace      how it ties channels: `rule(ctx, eqn)` (`rules.py`, `offsets.py`,
             `control.py`)
  shrink     how it runs at pruned shapes: `rule(shrinker, eqn, scope, index, invals)`
             (`shrink_rules.py`); None binds it with its traced parameters, right
             for primitives whose parameters hold no shapes
  flops      its cost: `rule(shape, eqn) -> (flops, iteration axes)` (`flops.py`);
             None counts nothing
  body       for a call (its body takes the operands and gives the results):
             the parameter holding the body
  subjaxprs  for loops and branches: `fn(eqn) -> [(sub_index, jaxpr, times run)]`

`sub_jaxprs(eqn)` is the only place the rest of the package learns which
primitives carry sub-jaxprs. A primitive with no entry blocks every tracked
axis it touches (never guess) and runs as traced. Equations computed from
constants alone (`iota`, `jnp.ones`, captured arrays) are never walked: see
`dataflow.constants`. Adding a primitive is one `register_primitive` call, or
one entry below; `primitive_table()` shows the table as it is, every column.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from jaxprune.structured._core import params as params_lib
from jaxprune.structured._primitives import control, offsets, rules, shrink_rules
from jaxprune.structured._primitives import flops as flops_lib


@dataclasses.dataclass(frozen=True)
class Primitive:
  """One row of the primitives table: `trace`, `shrink`, `flops`, `body`, `subjaxprs`.

  See `register_primitive` for what each column holds.
  """

  trace: rules.Rule
  shrink: shrink_rules.ShrinkRule | None = None
  flops: flops_lib.FlopsRule | None = None
  body: str | None = None
  subjaxprs: control.SubJaxprs | None = None

  def sub_jaxprs(self, eqn: Any) -> list[tuple[int, Any, float]]:
    if self.body is not None:
      return [(0, params_lib.call_body(eqn, self.body), 1.0)]
    return self.subjaxprs(eqn) if self.subjaxprs is not None else []


def _call(param: str) -> Primitive:
  return Primitive(control.call(param), shrink_rules.inline(param), body=param)


def _same(rule: rules.Rule, names: str) -> dict[str, Primitive]:
  return {name: Primitive(rule) for name in names.split()}


TABLE: dict[str, Primitive] = {
  **_same(
    rules.elementwise,
    (
      'abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt '
      'ceil clamp clz complex conj convert_element_type copy copy_p cos cosh digamma div eq '
      'erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac imag '
      'integer_pow is_finite le lgamma log log1p logistic lt max min mul mulhi ne neg '
      'nextafter not or polygamma population_count pow real regularized_incomplete_beta '
      'reduce_precision rem round rsqrt select_n shift_left shift_right_arithmetic '
      'shift_right_logical sign sin sinh sqrt square stop_gradient sub tan tanh threefry2x32 '
      'xor zeta'
    ),
  ),
  **_same(
    rules.reduce, 'reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax argmin'
  ),
  'reduce_sum': Primitive(rules.reduce, shrink_rules.reduce_sum),
  **_same(rules.collective, 'psum pmax pmin'),
  **_same(
    rules.fresh_outputs,
    'random_bits random_seed random_wrap random_unwrap '
    'random_split random_fold_in rng_bit_generator',
  ),
  **_same(rules.along_axis('axis'), 'cumsum cumprod cummax cummin cumlogsumexp top_k'),
  **_same(
    rules.reduce_window, 'reduce_window_sum reduce_window_max reduce_window_min reduce_window'
  ),
  # Identities: placement, scheduling and naming change no value. `name` is
  # `jax.ad_checkpoint.checkpoint_name`, which MaxText puts on every activation; `pvary`
  # and the `*_cast_p` casts mark a value's replication inside `shard_map`.
  **_same(
    rules.identity_pairs,
    'name optimization_barrier sharding_constraint layout_constraint '
    'with_memory_space_constraint reshard device_put random_clone pvary '
    'reduced_vary_cast_p vary_unreduced_cast_p',
  ),
  **_same(rules.no_values, 'debug_print debug_callback'),
  'bitcast_convert_type': Primitive(rules.bitcast),
  'broadcast_in_dim': Primitive(rules.broadcast_in_dim, shrink_rules.with_new_shape('shape')),
  'transpose': Primitive(rules.transpose),
  'squeeze': Primitive(rules.squeeze),
  'reshape': Primitive(rules.reshape, shrink_rules.with_new_shape('new_sizes')),
  'dot_general': Primitive(rules.dot_general, flops=flops_lib.dot_general),
  'conv_general_dilated': Primitive(rules.conv, shrink_rules.conv, flops_lib.conv_general_dilated),
  'sort': Primitive(rules.along_axis('dimension')),
  'concatenate': Primitive(offsets.concatenate),
  'split': Primitive(offsets.split, shrink_rules.split),
  'slice': Primitive(offsets.slice_, shrink_rules.slice_),
  'pad': Primitive(offsets.pad),
  'rev': Primitive(offsets.rev),
  'gather': Primitive(offsets.gather, shrink_rules.gather),
  'dynamic_slice': Primitive(offsets.dynamic_slice, shrink_rules.slice_sizes(0)),
  'dynamic_update_slice': Primitive(offsets.dynamic_update_slice),
  'scatter-add': Primitive(offsets.scatter_add),
  'tile': Primitive(offsets.tile),
  'stack': Primitive(offsets.stack),
  'unstack': Primitive(offsets.unstack),
  'jit': _call('jaxpr'),
  'pjit': _call('jaxpr'),  # the name of `jit` before jax 0.7
  'closed_call': _call('call_jaxpr'),
  'call': _call('call_jaxpr'),
  # jax 0.11.2 stages `closed_call` and `call` as `eval_jaxpr` (the same body parameter).
  'eval_jaxpr': _call('call_jaxpr'),
  'remat2': _call('jaxpr'),
  'custom_jvp_call': _call('call_jaxpr'),
  'custom_vjp_call': _call('call_jaxpr'),
  'composite': _call('jaxpr'),  # `call_jaxpr` in jax 0.11.2: read as either (`_core/params`)
  'scan': Primitive(control.scan, shrink_rules.scan, subjaxprs=control.scan_subjaxprs),
  'while': Primitive(
    control.while_loop, shrink_rules.while_loop, subjaxprs=control.while_subjaxprs
  ),
  'cond': Primitive(control.cond, shrink_rules.cond, subjaxprs=control.cond_subjaxprs),
}


def lookup(name: str) -> Primitive | None:
  """The table entry of a primitive, or None when it has none."""
  return TABLE.get(name)


def primitive_table() -> Mapping[str, Primitive]:
  """The primitives table as it is now (built in, and registered), read-only.

  Returns:
    `{eqn.primitive.name: Primitive}` with every column of every entry.
  """
  return types.MappingProxyType(TABLE)


def sub_jaxprs(eqn: Any) -> list[tuple[int, Any, float]]:
  """`(sub_index, jaxpr, times run per call)` for each sub-jaxpr of an equation."""
  entry = TABLE.get(eqn.primitive.name)
  return entry.sub_jaxprs(eqn) if entry is not None else []


def _check_name(primitive_name: Any) -> None:
  if not isinstance(primitive_name, str) or not primitive_name:
    raise TypeError(
      f'primitive_name must be a non-empty str (eqn.primitive.name), got {primitive_name!r}'
    )


def _check_callable(field: str, primitive_name: str, rule: Any, signature: str) -> None:
  if not callable(rule):
    raise TypeError(f'{field} for {primitive_name!r} must be callable{signature}, got {rule!r}')


def register_primitive(
  primitive_name: str,
  *,
  trace: rules.Rule,
  shrink: shrink_rules.ShrinkRule | None = None,
  flops: flops_lib.FlopsRule | None = None,
  body: str | None = None,
  subjaxprs: control.SubJaxprs | None = None,
) -> None:
  """Adds (or replaces) a primitive's entry: channel rule, shrink rule, cost, sub-jaxprs.

  `trace`, `shrink` and `flops` are set as given. The sub-jaxpr columns
  (`body`, `subjaxprs`) keep the table's when not given, so a call, loop or
  branch registered again (e.g. with a rule of your own for `pjit`) still has
  its sub-jaxprs walked, counted and evaluated.

  Args:
    primitive_name: `eqn.primitive.name`, e.g. 'my_fused_gelu'.
    trace: `rule(ctx, eqn)` tying its channels
      (docs/explanation/structured_design.md#one-primitive-table); for an elementwise
      primitive `jaxprune.structured.elementwise`.
    shrink: `rule(shrinker, eqn, scope, index, invals) -> outputs` when its
      parameters hold shapes; None binds it as traced.
    flops: `rule(shape, eqn) -> (flops, iteration axes)`;
      None counts no FLOPs for it.
    body: for a call primitive, the name of the parameter holding the body
      jaxpr, which takes the operands and gives the results.
    subjaxprs: for other primitives with sub-jaxprs (loops, branches),
      `fn(eqn) -> [(sub_index, jaxpr, times run per call)]`.

  Raises:
    TypeError: for a name that is not a non-empty str, a rule that is not
      callable or a `body` that is not a str.
    ValueError: for both `body` and `subjaxprs`.
  """
  _check_name(primitive_name)
  _check_callable('trace', primitive_name, trace, '(ctx, eqn)')
  if shrink is not None:
    _check_callable('shrink', primitive_name, shrink, '(shrinker, eqn, scope, index, invals)')
  if flops is not None:
    _check_callable('flops', primitive_name, flops, '(shape, eqn)')
  if body is not None and not isinstance(body, str):
    raise TypeError(
      f'body for {primitive_name!r} must be the name of the parameter holding '
      f"the call's body (a str, e.g. 'jaxpr'), got {body!r}"
    )
  if subjaxprs is not None:
    _check_callable('subjaxprs', primitive_name, subjaxprs, '(eqn)')
  if body is not None and subjaxprs is not None:
    raise ValueError(
      f'{primitive_name!r}: give body (a call) or subjaxprs (loops, branches), not both'
    )
  old = TABLE.get(primitive_name)
  if body is None and subjaxprs is None and old is not None:
    body, subjaxprs = old.body, old.subjaxprs
  TABLE[primitive_name] = Primitive(trace, shrink, flops, body, subjaxprs)


def _replace(primitive_name: str, **fields: Callable) -> None:
  entry = TABLE.get(primitive_name)
  if entry is None:
    entry = Primitive(rules.block_all)
  TABLE[primitive_name] = dataclasses.replace(entry, **fields)


def register_rule(primitive_name: str, rule: rules.Rule) -> None:
  """Sets (or replaces) the channel rule of a primitive, keeping its other columns.

  Args:
    primitive_name: `eqn.primitive.name`, e.g. 'my_fused_gelu'.
    rule: `rule(ctx, eqn)` (docs/explanation/structured_design.md#one-primitive-table). For
      an elementwise primitive use
      `jaxprune.structured.elementwise`.
  """
  _check_name(primitive_name)
  _check_callable('rule', primitive_name, rule, '(ctx, eqn)')
  _replace(primitive_name, trace=rule)


def register_shrink_rule(primitive_name: str, rule: shrink_rules.ShrinkRule) -> None:
  """Teaches the pruned callable how to run `primitive_name` on smaller inputs.

  Args:
    primitive_name: `eqn.primitive.name`.
    rule: `rule(shrinker, eqn, scope, eqn_index, invals) -> outputs`; the
      outputs must have `shrinker.shape(scope, outvar)` shapes.
  """
  _check_name(primitive_name)
  _check_callable('rule', primitive_name, rule, '(shrinker, eqn, scope, index, invals)')
  _replace(primitive_name, shrink=rule)
