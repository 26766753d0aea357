"""The main job on many devices: `config.mesh_shape` -> a mesh, shardings, a sharded step.

With `mesh_shape=(data, model)` the devices form a `('data', 'model')` mesh:
batches are split over `data`; each param is split along its last (output)
axis over `model` when that axis divides evenly, else replicated; the
optimizer state follows the params (`jaxprune.state_shardings`: masks like
their weights, thresholds and counters replicated). `mesh_shape=()` (the
default) runs on one device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxprune
from jaxprune_train._step import TrainState

MESH_AXES = ('data', 'model')


def make_mesh(mesh_shape: Sequence[int] | None) -> Mesh | None:
  """The `('data', 'model')` mesh of `mesh_shape`, or None for one device.

  Args:
    mesh_shape: `(data, model)` sizes whose product is the number of devices;
      `()` or None for a single-device run.

  Returns:
    A mesh with automatic (pjit-style) partitioning, or None.

  Raises:
    ValueError: if the shape is not two positive ints using all devices.
  """
  if not mesh_shape:
    return None
  shape = tuple(mesh_shape)
  if len(shape) != 2 or not all(isinstance(n, int) and n >= 1 for n in shape):
    raise ValueError(
      f'mesh_shape={mesh_shape!r}: expected (data, model) sizes such as (2, 4), '
      'or () for one device.'
    )
  if shape[0] * shape[1] != jax.device_count():
    raise ValueError(
      f'mesh_shape={shape!r} uses {shape[0] * shape[1]} devices but {jax.device_count()} '
      'are available; make the product of the sizes equal the device count, or use () '
      'for one device.'
    )
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def param_spec(leaf: Any, model_size: int) -> P:
  """The last axis over 'model' when it divides evenly (and is split at all), else replicated."""
  shape = getattr(leaf, 'shape', ())
  if model_size > 1 and shape and shape[-1] % model_size == 0:
    return P(*[None] * (len(shape) - 1), 'model')
  return P()


def train_state_shardings(mesh: Mesh, state: TrainState) -> TrainState:
  """The `NamedSharding` of every array of a train state (or of its `jax.eval_shape`)."""
  model_size = mesh.shape['model']
  params = jax.tree.map(lambda p: NamedSharding(mesh, param_spec(p, model_size)), state.params)
  return TrainState(
    step=NamedSharding(mesh, P()),
    params=params,
    opt_state=jaxprune.state_shardings(state.opt_state, params),
  )


def check_batch(mesh: Mesh | None, batch_size: int) -> None:
  """Raises ValueError unless batches of `batch_size` split evenly over the mesh's `data` axis."""
  if mesh is None:
    return
  data_size = mesh.shape['data']
  if batch_size % data_size:
    raise ValueError(
      f'batch_size={batch_size} cannot be split over the {data_size} devices '
      f'of the mesh axis "data"; use a multiple of {data_size}.'
    )


def jit_train_step(
  train_step: Callable, mesh: Mesh | None, state: TrainState, batch_size: int
) -> Callable:
  """`jax.jit(train_step)`, with the state's and the batch's shardings when on a mesh.

  Args:
    train_step: `(state, (x, y)) -> (state, metrics)`.
    mesh: from `make_mesh`, or None for one device.
    state: a train state (or its shapes), for the shardings.
    batch_size: examples per step; must be a multiple of the mesh's `data` size.

  Returns:
    The jitted step.

  Raises:
    ValueError: if the batch cannot be split evenly over `data`.
  """
  if mesh is None:
    return jax.jit(train_step)
  check_batch(mesh, batch_size)
  shardings = train_state_shardings(mesh, state)
  batch = NamedSharding(mesh, P('data'))
  return jax.jit(
    train_step,
    in_shardings=(shardings, (batch, batch)),
    out_shardings=(shardings, NamedSharding(mesh, P())),
  )


def place(state: TrainState, mesh: Mesh | None) -> TrainState:
  """Moves a train state (new or restored) onto the mesh's shardings; as is for None."""
  if mesh is None:
    return state
  return jax.device_put(state, train_state_shardings(mesh, state))
