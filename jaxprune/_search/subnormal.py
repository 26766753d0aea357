"""The warning for pruned leaves whose weights are all subnormal, which XLA:CPU reads as zero.

XLA on CPU flushes float32 subnormals (|w| < 2**-126, about 1.2e-38) to zero, in inputs
and results: `jnp.abs(w) > 0` is False and `jnp.max(jnp.abs(w))` is 0 for w = 1e-40, and
`optax.apply_updates` (p + u) writes 0. A leaf of such weights is therefore all zero to
the mask update, which keeps its mask (a zero-initialised layer is not pruned either),
and to the model and the optimizer; a sort of the magnitudes would prune half of it at
target 0.5. The rule cannot prune it as a sort would (the optimizer's own update zeroes
it), so it is told, at `init` and by an eager `update_mask`, where the weights are still
as the user gave them.

The check reads the weights on the host, where numpy does not flush: numpy arrays, and
jax arrays on CPU devices (no device transfer), and warns where a probe of the backend
finds that it flushes. Weights on an accelerator are not read: that would be a device
reduction and a compilation at each `init`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _warnings as warnings_lib
from jaxprune._numerics import SMALLEST_NORMAL


def _on_host(leaf: Any) -> tuple[np.ndarray, str] | None:
  """(the leaf as a numpy array, the platform that computes with it) where reading it
  costs no transfer, else None."""
  if isinstance(leaf, np.ndarray):
    return leaf, jax.default_backend()
  if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
    return None
  try:
    if not leaf.is_fully_addressable or any(d.platform != 'cpu' for d in leaf.devices()):
      return None
    return np.asarray(leaf), 'cpu'
  except (AttributeError, RuntimeError):  # a deleted or donated buffer: nothing to read
    return None


def _subnormal_layers(
  name: str, leaf: Any, layer_axes: int | tuple[int, ...]
) -> tuple[list[str], int, str]:
  """(the layers of a leaf whose nonzero weights are all below float32's smallest normal,
  each named with its largest |w|; how many layers were read; the platform)."""
  read = _on_host(leaf)
  if read is None:
    return [], 0, ''
  values, platform = read
  if values.size == 0 or not jnp.issubdtype(values.dtype, jnp.floating):  # bfloat16 too
    return [], 0, platform
  if not isinstance(layer_axes, int):  # the layer axes' indices: moved to the front
    values = np.moveaxis(values, layer_axes, tuple(range(len(layer_axes))))
    layer_axes = len(layer_axes)
  lead = values.shape[:layer_axes]
  per_layer = values.reshape((math.prod(lead), -1))
  with np.errstate(invalid='ignore'):
    largest = np.maximum(np.max(per_layer, axis=1), -np.min(per_layer, axis=1))
  labels = [name] if not lead else [f'{name}[{", ".join(map(str, i))}]' for i in np.ndindex(*lead)]
  found = [
    f'{label} (largest |w| {value:.3g})'
    for label, value in zip(labels, largest.tolist(), strict=True)
    if 0 < value < SMALLEST_NORMAL
  ]
  return found, len(labels), platform


@functools.cache
def _flushed(platform: str) -> bool:
  """Whether XLA on `platform` reads a float32 subnormal as zero (measured, once)."""
  device = jax.devices(platform)[0]
  tiny = jax.device_put(np.float32(1e-40), device)
  return not bool(jax.jit(lambda w: w != 0)(tiny))


def warn_subnormal(
  leaves: Iterable[tuple[str, Any, int | tuple[int, ...]]],
  where: str,
  together: bool = False,
) -> None:
  """Warns, naming them, about pruned layers that hold only subnormal (and zero) weights
  where the backend reads those as zero.

  Args:
    leaves: (name, weights, layer axes) of the pruned leaves: the number of leading layer
      axes, or the layer axes' indices.
    where: the call that is warned about, e.g. 'init' or 'update_mask'.
    together: one threshold for all the leaves (`global_pruning`): told only when every
      layer is subnormal (otherwise subnormal weights are the smallest, and pruned first,
      as a sort would).
  """
  found, platforms, read = [], set(), 0
  for name, leaf, layer_axes in leaves:
    layers, count, platform = _subnormal_layers(name, leaf, layer_axes)
    found += layers
    read += count
    if layers:
      platforms.add(platform)
  if not found or (together and len(found) < read) or len(platforms) != 1:
    return
  (platform,) = platforms
  if not _flushed(platform):
    return
  warnings_lib.warn(
    f"jaxprune: {where}: these pruned weights are all subnormal, below float32's smallest "
    f'normal ({SMALLEST_NORMAL:.3g}): {", ".join(found)}. XLA on {platform.upper()} '
    'reads them as zero in arithmetic and comparisons: the mask update sees all-zero weights '
    '(a threshold keeps their mask, so nothing is pruned; an N:M pattern picks among ties), '
    'and the model and the optimizer see zeros too (optax.apply_updates writes them). '
    'Rescale the weights into the normal range (a power of two, e.g. 2**100, scales them '
    'exactly) and compensate where the layer is used.'
  )
