"""The grouped arguments of `prune`: its calibration data, and how it calls a Linen module.

    jps.prune(model, x, variables=variables, ratio=0.5, importance='taylor',
              calibration=jps.Calibration(batches, loss_fn=loss, recalibrate_bn=True),
              linen=jps.LinenOptions(train_model=CNN(train=True), train_kwargs={}))

The keywords these replace (`loss_fn`, `calibration_batches`, `inputs`,
`recalibrate_bn`, `apply_kwargs`, `train_kwargs`, `train_model`) are refused
with a TypeError that names the new form (`moved_arguments`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from jaxprune.structured._prune.misuse import unknown_keywords


def first_input(batch: Any) -> tuple:
  """The model's inputs in a batch: the first element of a tuple or list, or the batch."""
  return tuple(batch[:1]) if isinstance(batch, (tuple, list)) else (batch,)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Calibration batches for `prune`: Taylor importance and BatchNorm re-calibration.

      calibration=Calibration(batches, loss_fn=loss)        # with importance='taylor'
      calibration=Calibration(batches, recalibrate_bn=True)  # a Flax model's BatchNorm

  `prune` checks every field before it traces anything.

  Attributes:
    batches: the batches, a list (any other iterable is read once, into a
      list); None when nothing needs them.
    loss_fn: `loss_fn(model_outputs, batch) -> scalar`, for `importance='taylor'`.
    inputs: maps a batch to the model's positional inputs (default: the first
      element of a tuple or list batch, or the batch itself).
    recalibrate_bn: re-estimate the BatchNorm statistics of the pruned Flax model
      on the batches (not for a plain function: see `jaxprune.structured.recalibrate`).
  """

  batches: Iterable[Any] | None
  loss_fn: Callable[[Any, Any], Any] | None = None
  inputs: Callable[[Any], tuple] = first_input
  recalibrate_bn: bool = False

  def __post_init__(self) -> None:
    if not isinstance(self.recalibrate_bn, (bool, np.bool_)):
      raise TypeError(f'Calibration.recalibrate_bn={self.recalibrate_bn!r}: give True or False.')
    shape = getattr(self.batches, 'shape', None)
    if shape is not None:  # iterating one array would give single examples
      raise TypeError(
        f'Calibration: batches is one array of shape {tuple(shape)}, which would be read '
        'one example at a time; give a list of batches: Calibration([x]) for one batch.'
      )


@dataclasses.dataclass(frozen=True)
class LinenOptions:
  """How `prune` calls a Flax Linen module (the arguments only a Linen module takes).

  Attributes:
    apply_kwargs: keyword arguments for every `model.apply` (when tracing, and
      in `result.apply`), e.g. `{'train': False}`.
    train_kwargs: keyword arguments that put BatchNorm in train mode for
      `Calibration(recalibrate_bn=True)` (default `{'train': True}`; `{}` when the
      mode is an attribute, see `train_model`).
    train_model: the module in train mode when the mode is a module attribute
      (e.g. `CNN(train=True)`); default the model itself.
  """

  apply_kwargs: Mapping[str, Any] | None = None
  train_kwargs: Mapping[str, Any] | None = None
  train_model: Any = None

  def __post_init__(self) -> None:
    import flax.linen as nn

    if self.train_model is not None and not isinstance(self.train_model, nn.Module):
      raise TypeError(
        'LinenOptions.train_model: give the Linen module in train mode, e.g. '
        f'LinenOptions(train_model=CNN(train=True), train_kwargs={{}}); got '
        f'{type(self.train_model).__name__} {self.train_model!r}.'
      )
    for name in ('apply_kwargs', 'train_kwargs'):
      value = getattr(self, name)
      if value is not None and not isinstance(value, Mapping):
        raise TypeError(
          f'LinenOptions.{name}: give a dict of keyword arguments, e.g. {{"train": True}}; '
          f'got {type(value).__name__} {value!r}.'
        )


# prune's keywords that moved into a group: old name -> (new keyword, its type, field).
MOVED = {
  'calibration_batches': ('calibration', Calibration, 'batches'),
  'loss_fn': ('calibration', Calibration, 'loss_fn'),
  'inputs': ('calibration', Calibration, 'inputs'),
  'recalibrate_bn': ('calibration', Calibration, 'recalibrate_bn'),
  'apply_kwargs': ('linen', LinenOptions, 'apply_kwargs'),
  'train_kwargs': ('linen', LinenOptions, 'train_kwargs'),
  'train_model': ('linen', LinenOptions, 'train_model'),
}


def moved_message(names: Iterable[str]) -> str:
  """One line naming where each of the old keywords `names` went, e.g.
  "prune: calibration_batches= moved: pass calibration=jaxprune.structured.Calibration(
  batches=...)"."""
  names = [name for name in MOVED if name in set(names)]
  parts = []
  for keyword in dict.fromkeys(MOVED[name][0] for name in names):
    old = [name for name in names if MOVED[name][0] == keyword]
    cls = MOVED[old[0]][1]
    fields = [MOVED[name][2] for name in old]
    shown = [] if 'batches' in fields or cls is not Calibration else ['batches']
    shown += [f'{f}=True' if f == 'recalibrate_bn' else f'{f}=...' for f in fields]
    parts.append(
      f'{", ".join(f"{name}=" for name in old)} moved: pass '
      f'{keyword}=jaxprune.structured.{cls.__name__}({", ".join(shown)})'
    )
  return f'prune: {"; ".join(parts)}'


def moved_arguments(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` refusing the keywords that moved into `Calibration` and `LinenOptions` with a
  TypeError naming the new form, and keywords it never took with one naming the keyword
  meant (its signature, for `help` and the docs, stays `fn`'s)."""

  accepted = [
    name for name, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY
  ]

  @functools.wraps(fn)
  def refusing_moved(*args: Any, **kwargs: Any) -> Any:
    moved = [name for name in kwargs if name in MOVED]
    if moved:
      raise TypeError(moved_message(moved))
    unknown = unknown_keywords(kwargs, accepted)
    if unknown:
      raise TypeError(unknown)
    return fn(*args, **kwargs)

  return refusing_moved
