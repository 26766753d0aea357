"""The one reader (and writer) of the parameters of loops, branches and calls.

JAX changes how these primitives describe their operands, and the pass reads
them in many places (the channel walk, the data-flow analyses, the FLOPs count,
the pruned callable). Every such place asks this module, and no other module
reads these parameters from `eqn.params`:

  `scan(eqn)`         a `scan`'s layout as a `Scan`: counts of consts, carries,
                      scanned-over values (xs) and stacked results (ys), its
                      body, length, direction and unroll;
  `while_loop(eqn)`   a `while`'s two bodies and their const counts (`While`);
  `branches(eqn)`     a `cond`'s branches;
  `call_body(eqn, p)` the body of a call held by parameter `p` (the primitives
                      table says which: `jaxpr` for `jit`, `call_jaxpr` for
                      `closed_call` and the custom derivative rules, ...; a
                      body renamed between `jaxpr` and `call_jaxpr`, as
                      `composite`'s in jax 0.11, is found under either);
  `inlines(eqn)`      whether a `jit` asks to be inlined when traced.

`scan` is written in one of two forms:

  jax < 0.11   `num_consts` and `num_carry` (ints; the operands are the consts,
               then the carry, then xs; the results the carry, then ys). Before
               jax 0.10 it also had `linear` (a bool per operand) and
               `_split_transpose`.
  jax >= 0.11  `ft_in` and `ft_out`, flat-tree descriptors of the operands and
               results (jax pull request 39005): `ft_in.unpack()` gives three
               descriptors (consts, carry, xs) and `ft_out.unpack()` two (carry,
               ys), each of which may nest further; `len()` of one is the number
               of flat operands it describes, in order.

`jaxpr`, `length`, `reverse` and `unroll` keep their names and meanings in both.
`jit`'s `inline` is a bool before jax 0.11 and a `jax.Inline` after (`True` is
`Inline.JAX_EARLY`, `False` is `Inline.AUTO`). The `with_*` functions give the
parameters that rebuild an equation with new bodies and more leading consts, in
the form the equation came in: the form of the installed JAX, which traced it.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Sequence
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class Scan:
  """The layout of a `scan` equation, whichever JAX wrote it.

  Operands are `n_consts` consts, then `n_carry` carries, then `n_xs` scanned-over
  values; results are `n_carry` carries, then `n_ys` stacked results. `body`
  (the closed jaxpr of one step) takes the operands and gives the results in
  that order (without the scanned axis).
  """

  n_consts: int
  n_carry: int
  n_xs: int
  n_ys: int
  body: Any
  length: Any  # an int, or a symbolic dimension
  reverse: bool
  unroll: Any

  @property
  def n_fixed(self) -> int:
    """Number of leading operands that are not scanned over (consts and carries)."""
    return self.n_consts + self.n_carry


@dataclasses.dataclass(frozen=True)
class While:
  """The layout of a `while` equation: `cond_nconsts` consts of `cond`, then
  `body_nconsts` consts of `body`, then the carry (also the results)."""

  cond_nconsts: int
  body_nconsts: int
  cond: Any
  body: Any


def _parts(descriptor: Any, n: int, name: str, eqn: Any) -> list[int]:
  """The number of flat values in each of the `n` top-level parts of a flat-tree descriptor."""
  parts = descriptor.unpack()
  if len(parts) != n:
    raise NotImplementedError(
      f"jaxprune.structured reads a scan's {name} as {n} parts; this one has "
      f'{len(parts)} (jax {jax.__version__}, parameters {sorted(eqn.params)}).'
    )
  return [len(part) for part in parts]


def scan(eqn: Any) -> Scan:
  """A `scan` equation's layout, from the jax < 0.11 or the jax >= 0.11 parameters.

  Raises:
    NotImplementedError: for a scan written in neither form, naming its parameters.
  """
  params = eqn.params
  if 'ft_in' in params and 'ft_out' in params:
    n_consts, n_carry, n_xs = _parts(params['ft_in'], 3, 'ft_in', eqn)
    n_carry_out, n_ys = _parts(params['ft_out'], 2, 'ft_out', eqn)
    if n_carry_out != n_carry:
      raise NotImplementedError(
        f'jaxprune.structured: a scan with {n_carry} carries in and {n_carry_out} out.'
      )
  elif 'num_consts' in params and 'num_carry' in params:
    n_consts, n_carry = params['num_consts'], params['num_carry']
    n_xs = len(eqn.invars) - n_consts - n_carry
    n_ys = len(eqn.outvars) - n_carry
  else:
    raise NotImplementedError(
      f'jaxprune.structured reads lax.scan with num_consts/num_carry (jax<0.11) or '
      f'ft_in/ft_out (jax>=0.11); jax {jax.__version__} wrote one with the parameters '
      f'{sorted(params)}. Please report it, or unroll the loop.'
    )
  return Scan(
    n_consts=n_consts,
    n_carry=n_carry,
    n_xs=n_xs,
    n_ys=n_ys,
    body=params['jaxpr'],
    length=params['length'],
    reverse=bool(params.get('reverse', False)),
    unroll=params.get('unroll', 1),
  )


def scan_with_consts(eqn: Any, body: Any, n_new: int) -> dict[str, Any]:
  """Parameters that rebind a `scan` with body `body` and `n_new` more leading consts.

  Written in the equation's form: `num_consts` (and `linear`, where present) for
  jax < 0.11, `ft_in` for jax >= 0.11, whose consts part becomes the `n_new` new
  consts followed by the old consts part.
  """
  new: dict[str, Any] = {'jaxpr': body}
  if not n_new:
    return new
  params = eqn.params
  if 'ft_in' in params:
    ft_in = params['ft_in']
    consts, carry, xs = ft_in.unpack()
    ft = _flattree(ft_in)
    new['ft_in'] = ft.pack((ft.pack((ft.nones(n_new), consts)), carry, xs))
    return new
  new['num_consts'] = scan(eqn).n_consts + n_new
  if params.get('linear') is not None:  # jax < 0.10: one flag per operand
    new['linear'] = (False,) * n_new + tuple(params['linear'])
  return new


def _flattree(descriptor: Any) -> Any:
  """The module that defines a flat-tree descriptor's class (`pack`, `nones`)."""
  module = sys.modules.get(type(descriptor).__module__)
  if module is None or not all(hasattr(module, f) for f in ('pack', 'nones')):
    raise NotImplementedError(
      f"jaxprune.structured cannot rebuild a scan's ft_in ({type(descriptor).__name__} "
      f'of module {type(descriptor).__module__}) under jax {jax.__version__}: it has no '
      'pack/nones. Please report it.'
    )
  return module


def while_loop(eqn: Any) -> While:
  """A `while` equation's layout."""
  params = eqn.params
  return While(
    cond_nconsts=params['cond_nconsts'],
    body_nconsts=params['body_nconsts'],
    cond=params['cond_jaxpr'],
    body=params['body_jaxpr'],
  )


def while_with_consts(
  eqn: Any, cond: Any, body: Any, n_cond_new: int, n_body_new: int
) -> dict[str, Any]:
  """Parameters that rebind a `while` with new bodies, each with more leading consts."""
  loop = while_loop(eqn)
  return {
    'cond_jaxpr': cond,
    'body_jaxpr': body,
    'cond_nconsts': loop.cond_nconsts + n_cond_new,
    'body_nconsts': loop.body_nconsts + n_body_new,
  }


def branches(eqn: Any) -> tuple[Any, ...]:
  """A `cond` equation's branches (closed jaxprs), in index order."""
  return tuple(eqn.params['branches'])


def cond_with_branches(eqn: Any, new: Sequence[Any]) -> dict[str, Any]:
  """Parameters that rebind a `cond` with new branches."""
  del eqn
  return {'branches': tuple(new)}


# A call's body parameter that JAX renamed: `composite` holds its body in `jaxpr` up
# to jax 0.11.0 and in `call_jaxpr` in jax 0.11.2.
_BODY_RENAMED = {'jaxpr': 'call_jaxpr', 'call_jaxpr': 'jaxpr'}


def call_body(eqn: Any, param: str) -> Any:
  """The (open or closed) body of a call equation, held by its parameter `param`
  (or, where JAX renamed it, by the other of `jaxpr` / `call_jaxpr`).

  Raises:
    KeyError: when the equation has neither, naming its parameters.
  """
  params = eqn.params
  if param in params:
    return params[param]
  renamed = _BODY_RENAMED.get(param)
  if renamed is not None and renamed in params:
    return params[renamed]
  raise KeyError(
    f'jaxprune.structured: {eqn.primitive.name} has no body parameter '
    f'{param!r} (jax {jax.__version__} wrote {sorted(params)}).'
  )


def inlines(eqn: Any) -> bool:
  """Whether a `jit` equation asks to be inlined into its caller when traced.

  `inline=True` before jax 0.11; `jax.Inline.JAX_EARLY` from jax 0.11 on (other
  members, e.g. `AUTO`, the old `False`, inline later or never).
  """
  value = eqn.params.get('inline', False)
  if isinstance(value, enum.Enum):
    return value.value == 'jax_early'
  return bool(value)
