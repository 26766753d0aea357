"""The product primitives, and the one reader of their `dimension_numbers`.

A product multiplies two operands and sums over some of their axes: a matrix
product (`dot_general`) or a convolution (`conv_general_dilated`). The
channel rules, the FLOPs, the shrink rules, the group kinds, the precision
the checks run at and one-shot pruning's layers all need to know which axes
of which operand are contracted, batched or spatial; they read it here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# The primitives that multiply their two operands and sum over some of their axes.
PRODUCTS = ('dot_general', 'conv_general_dilated')


class DotAxes(NamedTuple):
  """The axes of a `dot_general`, per operand (0: lhs, 1: rhs).

  Its output holds the batch axes, then the lhs's free axes, then the rhs's
  free axes (the axes neither contracted nor batched), each in order.

  Attributes:
    contract: `(lhs axes, rhs axes)` summed over, paired in order.
    batch: `(lhs axes, rhs axes)` kept apart, paired in order.
  """

  contract: tuple[tuple[int, ...], tuple[int, ...]]
  batch: tuple[tuple[int, ...], tuple[int, ...]]


def dot_axes(eqn: Any) -> DotAxes:
  """The contracting and batch axes of a `dot_general` equation."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params['dimension_numbers']
  return DotAxes((tuple(lhs_contract), tuple(rhs_contract)), (tuple(lhs_batch), tuple(rhs_batch)))


class ConvAxes(NamedTuple):
  """The axes of a `conv_general_dilated`: where each operand and the output hold
  their batch, feature and spatial axes (`lax.ConvDimensionNumbers`, named).

  Attributes:
    lhs_batch: the input's batch axis.
    lhs_feature: the input's feature axis.
    lhs_spatial: the input's spatial axes, in the kernel's window order.
    rhs_out: the kernel's output-feature axis.
    rhs_in: the kernel's input-feature axis (per feature group).
    rhs_spatial: the kernel's spatial (window) axes.
    out_batch: the output's batch axis.
    out_feature: the output's feature axis.
    out_spatial: the output's spatial axes.
  """

  lhs_batch: int
  lhs_feature: int
  lhs_spatial: tuple[int, ...]
  rhs_out: int
  rhs_in: int
  rhs_spatial: tuple[int, ...]
  out_batch: int
  out_feature: int
  out_spatial: tuple[int, ...]

  @property
  def lhs_layout(self) -> tuple[int, ...]:
    """The input's axes as `(batch, feature, spatial...)`: a transpose to NC... order."""
    return (self.lhs_batch, self.lhs_feature, *self.lhs_spatial)


def conv_axes(eqn: Any) -> ConvAxes:
  """The batch, feature and spatial axes of a `conv_general_dilated` equation."""
  lhs, rhs, out = eqn.params['dimension_numbers']
  return ConvAxes(
    lhs[0], lhs[1], tuple(lhs[2:]), rhs[0], rhs[1], tuple(rhs[2:]), out[0], out[1], tuple(out[2:])
  )
