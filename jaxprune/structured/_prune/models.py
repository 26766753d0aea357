"""The models `prune` takes, each behind one small adapter: Flax Linen, Flax NNX and
plain JAX functions.

`prune` runs one path (trace, score, select, shrink, check, re-calibrate) and
asks the adapter only what differs between model kinds:

  traced()        `(fn, variables)`: the function `trace` sees,
                  `fn(variables, *args)`, and the dense variables
  runner(new)     the pruned model as users run it (a Linen `result.apply` at
                  the new sizes; the NNX model rebuilt at them); None for a
                  plain function, whose users run the pruned callable itself
  recalibrated()  the new variables after re-estimating BatchNorm statistics
  committed(new)  what `PruneResult.variables` holds; an NNX model is changed
                  in place only here, once every check has passed
  pruned_model(f) what `PruneResult.model` holds: the module, or the pruned
                  callable `f` for a plain function
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
from flax import nnx

from jaxprune.structured._prune.options import LinenOptions
from jaxprune.structured._shrink import calibrate, flax_rebuild

PyTree = Any


@contextlib.contextmanager
def explained(what: str) -> Iterator[None]:
  """Re-raises a failure of the resized model with what happened and what runs instead."""
  try:
    yield
  except (flax.errors.FlaxError, TypeError, ValueError) as e:
    raise RuntimeError(
      f'prune: {what} fails on the pruned model ({type(e).__name__}: {str(e)[:300]}). '
      "The model's code most likely branches on shapes that pruning changed (e.g. "
      '`if x.shape[-1] != self.features: x = proj(x)`), so at the new sizes it takes another '
      'path than the one traced. The pruned callable runs the traced computation at the new '
      'sizes: prune(..., check=False) and call result.pruned_fn(result.variables, x) (it '
      'exports with jax.export), or keep that group whole with '
      'Constraint(locked=(...,)).'
    ) from e


class ResizedLinen:
  """A pruned Linen module: `apply(variables, ...)` runs the module at the variables' sizes.

  Linen checks every parameter against the shape its module would create, so
  the original module refuses the smaller arrays (`ScopeParamShapeError`);
  this wrapper applies it inside `flax_rebuild.linen_resized(variables)`. Any
  other attribute is the module's (`module` is the module itself).
  """

  def __init__(self, module: nn.Module):
    self.module = module

  def apply(self, variables: PyTree, *args: Any, **kwargs: Any) -> Any:
    with flax_rebuild.linen_resized(variables), explained('result.model.apply'):
      return self.module.apply(variables, *args, **kwargs)

  def __getattr__(self, name: str) -> Any:
    return getattr(self.module, name)

  def __repr__(self) -> str:
    return f'ResizedLinen({type(self.module).__name__}: apply runs it at the pruned sizes)'


class LinenModel:
  """A Linen module and its variables; `apply_kwargs` go to every `model.apply`."""

  name = 'result.apply'

  def __init__(
    self,
    model: nn.Module,
    variables: PyTree,
    apply_kwargs: Mapping[str, Any] | None,
    train_model: nn.Module | None,
    train_kwargs: Mapping[str, Any] | None,
  ):
    self.model, self.variables, self.apply_kwargs = model, variables, apply_kwargs
    self.train_model, self.train_kwargs = train_model, train_kwargs

  def traced(self) -> tuple[Callable[..., Any], PyTree]:
    self.apply_kwargs = dict(self.apply_kwargs or {})  # checked a Mapping by then
    return functools.partial(self.model.apply, **self.apply_kwargs), self.variables

  def runner(self, new_variables: PyTree) -> Callable[..., Any]:
    def run(*args):
      with flax_rebuild.linen_resized(new_variables), explained(self.name):
        return self.model.apply(new_variables, *args, **self.apply_kwargs)

    return run

  def recalibrated(
    self,
    new_variables: PyTree,
    batches: Sequence[Any],
    inputs: Callable[[Any], tuple],
    progress: bool,
  ) -> PyTree:
    if 'batch_stats' not in new_variables:
      return new_variables
    kwargs = {'train': True} if self.train_kwargs is None else dict(self.train_kwargs)
    update = calibrate.linen_update_fn(
      self.train_model or self.model, new_variables, inputs=inputs, **kwargs
    )

    def resized_update(stats, batch):
      with flax_rebuild.linen_resized(new_variables):
        return update(stats, batch)

    stats = calibrate.recalibrate(resized_update, new_variables['batch_stats'], batches, progress)
    return {**new_variables, 'batch_stats': stats}

  def committed(self, new_variables: PyTree) -> PyTree:
    return new_variables

  def pruned_model(self, pruned_fn: Callable[..., Any]) -> ResizedLinen:
    del pruned_fn
    return ResizedLinen(self.model)


class NnxModel:
  """An NNX module, pruned in place once the pruned copy has passed every check."""

  name = 'the pruned NNX model'

  def __init__(self, model: nnx.Module):
    self.model = model
    self.pruned: nnx.Module | None = None

  def traced(self) -> tuple[Callable[..., Any], PyTree]:
    self.graphdef, variables = nnx.split(self.model)
    return lambda state, *args: nnx.merge(self.graphdef, state)(*args), variables

  def runner(self, new_variables: PyTree) -> Callable[..., Any]:
    self.pruned = flax_rebuild.update_nnx_attributes(nnx.merge(self.graphdef, new_variables))

    def run(*args):
      with explained(self.name):
        return self.pruned(*args)

    return run

  def recalibrated(
    self,
    new_variables: PyTree,
    batches: Sequence[Any],
    inputs: Callable[[Any], tuple],
    progress: bool,
  ) -> PyTree:
    calibrate.recalibrate_nnx(self.pruned, batches, inputs, progress)
    return new_variables

  def committed(self, new_variables: PyTree) -> PyTree:
    del new_variables  # the pruned copy's state, re-calibrated, is the one to keep
    flax_rebuild.update_nnx(self.model, nnx.state(self.pruned))
    return nnx.state(self.model)

  def pruned_model(self, pruned_fn: Callable[..., Any]) -> nnx.Module:
    del pruned_fn
    return self.model


class FunctionModel:
  """A plain JAX function `fn(variables, *args)` (haiku, equinox, keras, your own):
  its pruned model is the pruned callable, `pruned_fn(new_variables, *args)`."""

  name = 'the pruned function'

  def __init__(self, fn: Callable[..., Any], variables: PyTree):
    self.fn, self.variables = fn, variables

  def traced(self) -> tuple[Callable[..., Any], PyTree]:
    return self.fn, self.variables

  def runner(self, new_variables: PyTree) -> None:
    del new_variables  # the pruned callable, checked as such, is what users run

  def recalibrated(
    self,
    new_variables: PyTree,
    batches: Sequence[Any],
    inputs: Callable[[Any], tuple],
    progress: bool,
  ) -> PyTree:
    raise AssertionError('unreachable: adapter refuses recalibrate_bn for a plain function')

  def committed(self, new_variables: PyTree) -> PyTree:
    return new_variables

  def pruned_model(self, pruned_fn: Callable[..., Any]) -> Callable[..., Any]:
    return pruned_fn


def adapter(
  model: Any, variables: PyTree | None, linen: LinenOptions, recalibrate_bn: bool
) -> LinenModel | NnxModel | FunctionModel:
  """The adapter of `model`; a TypeError or ValueError naming the fix for anything else."""
  if isinstance(model, nnx.Module):
    if variables is not None:
      raise ValueError(
        'prune: an NNX module holds its own variables; drop variables=... '
        f'(got variables={type(variables).__name__}).'
      )
    return NnxModel(model)
  if variables is None:
    raise ValueError(
      f'prune: pass variables=... with a {type(model).__name__}: the Linen '
      "variables, or the pytree a plain function's first argument takes."
    )
  if isinstance(model, nn.Module):
    return LinenModel(model, variables, linen.apply_kwargs, linen.train_model, linen.train_kwargs)
  if not callable(model):
    raise TypeError(
      f'prune: model must be a Flax Linen or NNX module or a function '
      f'fn(variables, *args), got {type(model).__name__}.'
    )
  linen_only = {
    'apply_kwargs': linen.apply_kwargs,
    'train_model': linen.train_model,
    'train_kwargs': linen.train_kwargs,
    'recalibrate_bn': recalibrate_bn or None,
  }
  given = [name for name, value in linen_only.items() if value is not None]
  if given:
    raise ValueError(
      f'prune: {", ".join(given)} apply to Flax models, not to a plain function. Bind keyword '
      'arguments in the function (functools.partial), and re-estimate BatchNorm statistics '
      'of result.pruned_fn yourself with jaxprune.structured.recalibrate.'
    )
  return FunctionModel(model, variables)
