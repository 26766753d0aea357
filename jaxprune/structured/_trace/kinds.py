"""What a group's channels are in a transformer: width, heads, head_dim or channels.

Read from the jaxpr, not from names. A value *depends on the inputs* when some
model input flows into it (weights, and anything computed from weights and
constants alone, do not). Attention multiplies two such values (queries by
keys, scores by values); every other `dot_general` multiplies an activation
by a weight. So:

  width     a group summed over by a norm (`trace(norms=...)`, see `_trace/norms.py`);
  heads     a group on a batch axis of an activation x activation product;
  head_dim  a group on another axis of one (contracted q.k dims, v's dims);
  experts   a group on a batch axis of an activation x weight product (the
            expert axis of a mixture of experts: one weight per expert); a
            product by a constant (the sin/cos table of RoFormer's rotary
            embeddings, `einsum('bslh,sh->bslh', x, cos)`) is no weight;
  recurrent a group on the carry of a `scan` over the inputs (LSTM/GRU hidden
            units: the same weights at every step, unlike scanned layers,
            whose weights are the scanned-over values);
  channels  every other group (MLP hidden units, conv filters, a pooler).

Dependence on the inputs is followed through calls and into loops and
branches operand by operand (a loop's carry until it settles), so the
weights a recurrent cell reads inside its `scan` stay weights.

The same walk finds the *activation sites* of each group for activation
importance: the activation operand of an activation x weight product along
the axis it contracts (a norm's output entering q/k/v and the MLP, the MLP
hidden units entering the down projection, the heads entering the output
projection), or, for groups that never enter a weight (q/k head_dim), the
outputs of the products that make them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxprune.structured._core import jaxprs, products
from jaxprune.structured._core import params as params_lib
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._primitives import control, table, traversal

Scope = tuple[int, ...]


def dependent(jaxpr: Any, inputs: list[bool], scope: Scope, found: set) -> list[bool]:
  """Adds `(scope, var)` of every variable that depends on a model input to `found`.

  Args:
    jaxpr: an open jaxpr.
    inputs: per invar, whether it depends on a model input.
    scope: the jaxpr's scope.
    found: the set to add to.

  Returns:
    Per outvar, whether it depends on a model input.
  """
  found.update((scope, v) for v, d in zip(jaxpr.invars, inputs, strict=True) if d)

  def step(s, index, eqn, ins):
    body = traversal.call_body(eqn)
    if body is not None:
      outs = dependent(control.inner(body), ins, s + (index, 0), found)
    elif eqn.primitive.name in _LOOPS:
      outs = _LOOPS[eqn.primitive.name](eqn, ins, s + (index,), found)
    else:
      # Other sub-jaxprs: everything inside depends on the inputs if any operand does.
      for sub_index, sub, _ in table.sub_jaxprs(eqn):
        sub = control.inner(sub)
        dependent(sub, [any(ins)] * len(sub.invars), s + (index, sub_index), found)
      outs = [any(ins)] * len(eqn.outvars)
    found.update((s, v) for v, d in zip(eqn.outvars, outs, strict=True) if d and jaxprs.is_var(v))
    return outs

  return jaxprs.evaluate(
    jaxpr, [False] * len(jaxpr.constvars), inputs, step, scope, literal=lambda _: False
  )


def _scan(eqn: Any, ins: list[bool], scope: Scope, found: set) -> list[bool]:
  """`scan`: consts and scanned-over values as given, the carry until it settles."""
  loop = params_lib.scan(eqn)
  n_consts, n_carry = loop.n_consts, loop.n_carry
  body = control.inner(loop.body)
  carry = ins[n_consts : n_consts + n_carry]
  while True:
    outs = dependent(
      body, [*ins[:n_consts], *carry, *ins[n_consts + n_carry :]], scope + (0,), found
    )
    settled = [a or b for a, b in zip(carry, outs[:n_carry], strict=True)]
    if settled == carry:
      return outs
    carry = settled


def _while(eqn: Any, ins: list[bool], scope: Scope, found: set) -> list[bool]:
  """`while`: each body's consts as given, the carry until it settles."""
  loop = params_lib.while_loop(eqn)
  n_cond, n_body = loop.cond_nconsts, loop.body_nconsts
  cond = control.inner(loop.cond)
  body = control.inner(loop.body)
  carry = ins[n_cond + n_body :]
  while True:
    dependent(cond, [*ins[:n_cond], *carry], scope + (0,), found)
    outs = dependent(body, [*ins[n_cond : n_cond + n_body], *carry], scope + (1,), found)
    settled = [a or b for a, b in zip(carry, outs, strict=True)]
    if settled == carry:
      return carry
    carry = settled


def _cond(eqn: Any, ins: list[bool], scope: Scope, found: set) -> list[bool]:
  """`cond`: every branch on the operands; an output from an input-dependent
  index or from any branch's dependent value depends on the inputs."""
  outs = [ins[0]] * len(eqn.outvars)
  for sub_index, branch in enumerate(params_lib.branches(eqn)):
    branch_outs = dependent(control.inner(branch), ins[1:], scope + (sub_index,), found)
    outs = [a or b for a, b in zip(outs, branch_outs, strict=True)]
  return outs


_LOOPS = {'scan': _scan, 'while': _while, 'cond': _cond}


def _recurrent(scope: Scope, index: int, eqn: Any, found: set) -> list[Any]:
  """The carry variables (in the body's scope) of a `scan` over input-dependent values."""
  if eqn.primitive.name != 'scan':
    return []
  loop = params_lib.scan(eqn)
  body = control.inner(loop.body)
  xs = body.invars[loop.n_fixed :]
  if not any((scope + (index, 0), v) in found for v in xs):
    return []
  return body.invars[loop.n_consts : loop.n_fixed]


def input_dependent(graph: DependencyGraph, n_inputs: int, variables: bool = False) -> set:
  """`(scope, var)` of every variable of the first entry point that depends on a model input.

  Args:
    graph: a DependencyGraph.
    n_inputs: number of flat model inputs after the variables leaves.
    variables: those that depend on a variables leaf instead (weights, and
      what is computed from them; not constants).
  """
  point = graph.entries[0]
  found: set = set()
  dependent(
    point.closed_jaxpr.jaxpr,
    [variables] * len(graph.leaf_names) + [not variables] * n_inputs,
    point.scope,
    found,
  )
  return found


def activation_products(graph: DependencyGraph, n_inputs: int) -> Callable[[Scope, Any], bool]:
  """`is_product(scope, eqn)`: whether an equation multiplies two activations (attention's
  queries by keys and scores by values), not an activation by a weight.

  Counters that see only layers (Torch-Pruning's `count_ops_and_params`) leave
  these out; `count_flops(graph, plan, skip=activation_products(...))` counts
  FLOPs as they do.
  """
  found = input_dependent(graph, n_inputs)
  return lambda scope, eqn: all(jaxprs.is_var(v) and (scope, v) in found for v in eqn.invars[:2])


def analyse(graph: DependencyGraph, n_inputs: int) -> tuple[dict[int, str], dict[int, list]]:
  """Kinds of the groups and their activation sites, from the first entry point.

  Args:
    graph: a DependencyGraph (its `var_axes` and first entry point).
    n_inputs: number of flat model inputs after the variables leaves.

  Returns:
    `(kinds, sites)`: `{group id: a kind}` (width groups are
    marked by `_trace/norms.py`, the rest are 'channels'), and `{group id: [(scope,
    eqn index, operand index or -1 for the output, axis, that variable)]}`.
  """
  point = graph.entries[0]
  found = input_dependent(graph, n_inputs)
  from_variables = input_dependent(graph, n_inputs, variables=True)
  kinds: dict[int, str] = {}
  contracted: dict[int, list] = {}
  produced: dict[int, list] = {}

  def groups_on(scope, var, axis):
    return [part.group_id for part in graph.var_axes.get((scope, var), {}).get(axis, ())]

  experts, recurrent = set(), set()
  for scope, index, eqn, _ in traversal.equations(point.closed_jaxpr, point.scope):
    name = eqn.primitive.name
    for var in _recurrent(scope, index, eqn, found):
      for axis in range(len(var.aval.shape)):
        recurrent.update(groups_on(scope + (index, 0), var, axis))
    if name not in products.PRODUCTS:
      continue
    is_act = [jaxprs.is_var(v) and (scope, v) in found for v in eqn.invars[:2]]
    operands = graph.proxied.get((scope, index), eqn).invars[:2]
    if name == 'conv_general_dilated':
      conv = products.conv_axes(eqn)
      contract, out_axes = ([conv.lhs_feature], []), [conv.out_feature]
    else:
      dot = products.dot_axes(eqn)
      contract, out_axes = dot.contract, range(len(eqn.outvars[0].aval.shape))
      if all(is_act):  # attention: queries x keys, scores x values
        for var, batch in zip(operands, dot.batch, strict=True):
          for axis in range(len(var.aval.shape)):
            for gid in groups_on(scope, var, axis):
              kind = 'heads' if axis in batch else 'head_dim'
              if kinds.get(gid) != 'heads':
                kinds[gid] = kind
        continue
    if is_act.count(True) != 1:
      continue
    act = is_act.index(True)
    weight = 1 - act
    weight_var = eqn.invars[weight]
    if (
      name == 'dot_general' and jaxprs.is_var(weight_var) and (scope, weight_var) in from_variables
    ):
      for axis in dot.batch[weight]:
        experts.update(groups_on(scope, operands[weight], axis))
    for axis in contract[act]:
      for gid in groups_on(scope, operands[act], axis):
        contracted.setdefault(gid, []).append((scope, index, act, axis, operands[act]))
    for axis in out_axes:
      for gid in groups_on(scope, eqn.outvars[0], axis):
        produced.setdefault(gid, []).append((scope, index, -1, axis, eqn.outvars[0]))
  for gid in experts | recurrent:
    if kinds.get(gid) != 'heads':
      kinds[gid] = 'experts' if gid in experts else 'recurrent'
  sites = {gid: contracted.get(gid) or produced[gid] for gid in set(contracted) | set(produced)}
  return kinds, sites
