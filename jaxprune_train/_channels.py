"""Channel pruning in the main job: the mask rule, then the smaller model and its artifact.

With `config.channels.enabled`, the job traces its model once, prunes whole
coupled channels with `jaxprune.channels.ChannelRule` on the usual schedule,
and at the end cuts the removed channels out (`jaxprune.channels.shrink`),
writes the smaller model as a `jax.export` artifact of images -> logits with
the weights inside and a symbolic batch dimension (`pruned_model.bin`), and
measures what it gained: FLOPs, CPU time against the dense-shaped model, and
the test accuracy of the artifact itself.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxprune._results.flops import FlopsReport, flops_text
from jaxprune_train import _files as files

# jaxprune.channels and jaxprune.structured (Flax NNX, SciPy) are imported inside the
# functions below: only runs that prune channels load them (half a second of every
# other run's start).
if TYPE_CHECKING:
  from jaxprune.channels import ChannelRule
  from jaxprune.structured import DenseDistance

MODEL_FILE = 'pruned_model.bin'
# Images per call when timing the dense and the shrunk model against each other.
TIMING_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class ChannelResult(FlopsReport):
  """What the end of a channel-pruning run measured (its `flops_kept` is `FlopsReport`'s).

  Attributes:
    groups: (label, channels kept, channels before) per pruned group.
    flops_before: FLOPs per image of the model as trained.
    flops_after: FLOPs per image of the shrunk model.
    speedup: CPU time per batch of the model as trained over the shrunk
      model's (exported artifact), timed interleaved.
    test_accuracy: the exported artifact's accuracy on the test split.
    path: where the artifact was written (None without a workdir).
    vs_trained: how far the artifact's logits on the test split are from the
      model as trained, at its dense shapes (None when not measured).
  """

  groups: list[tuple[str, int, int]]
  flops_before: float
  flops_after: float
  speedup: float
  test_accuracy: float
  path: str | None
  vs_trained: DenseDistance | None = None

  def scalars(self) -> dict[str, float]:
    """The metrics.jsonl record of the shrunk model."""
    return {
      'flops_before': self.flops_before,
      'flops_after': self.flops_after,
      'flops_kept': self.flops_kept,
      'speedup': self.speedup,
      'test_accuracy': self.test_accuracy,
    }

  def lines(self) -> list[str]:
    """The report's channel section."""
    width = max(len(label) for label, _, _ in self.groups) if self.groups else 0
    out = ['channel groups (kept / before):']
    out += [f'  {label.ljust(width)}  {kept:>4} / {size}' for label, kept, size in self.groups]
    out.append(
      f'FLOPs per image: {self.flops_before:,.0f} -> {self.flops_after:,.0f} '
      f'({flops_text(self.flops_kept)}); CPU speedup {self.speedup:.2f}x '
      f'(batch {TIMING_BATCH})'
    )
    where = f' ({MODEL_FILE})' if self.path else ''
    out.append(f'shrunk model{where}: test accuracy {self.test_accuracy:.2%}')
    if self.vs_trained is not None:
      out.append(f'shrunk model {self.vs_trained.line()}')
    return out


def _example(input_shape: tuple[int, ...]) -> jax.Array:
  return jnp.zeros((2, *input_shape), jnp.float32)


def make_rule(
  config: ml_collections.ConfigDict, model: nn.Module, params: Any, input_shape: tuple[int, ...]
) -> ChannelRule | None:
  """The channel rule of the run (None unless `config.channels.enabled` and `config.prune`).

  Args:
    config: the training config (`channels.round_to`, `channels.min_channels`).
    model: the Flax module.
    params: its initial params (only their shapes matter).
    input_shape: the shape of one image.

  Returns:
    A `ChannelRule` over the model traced on a batch of two images.
  """
  if not (config.prune and config.channels.enabled):
    return None
  try:  # checked now, not after training: the run ends by serialising the shrunk model
    import flatbuffers  # noqa: F401
  except ImportError as err:
    raise ValueError(
      f'config.channels.enabled=True writes {MODEL_FILE} with jax.export, whose '
      "serialisation needs the 'flatbuffers' package: pip install flatbuffers "
      '(or pip install "jaxprune[examples]").'
    ) from err
  from jaxprune.channels import ChannelRule
  from jaxprune.structured import Constraint, trace

  graph = trace(model.apply, {'params': params}, _example(input_shape))
  constraint = Constraint(
    min_channels=config.channels.min_channels, round_to=config.channels.round_to
  )
  return ChannelRule(graph, constraint=constraint)


def _median_seconds(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
  """Median seconds per call of each function, called in turns after a warm-up."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(ts) for name, ts in times.items()}


def export_bytes(pruned_fn: Callable, variables: Any, input_shape: tuple[int, ...]) -> bytes:
  """`pruned_fn(variables, images)` as a serialized `jax.export` artifact, weights inside.

  The batch dimension is symbolic, so the artifact runs at any batch size.
  """
  shape = jax.export.symbolic_shape(', '.join(['b', *map(str, input_shape)]))
  apply = jax.jit(lambda images: pruned_fn(variables, images))
  exported = jax.export.export(apply)(jax.ShapeDtypeStruct(shape, jnp.float32))
  return bytes(exported.serialize())


def finish(
  rule: ChannelRule,
  model: nn.Module,
  params: Any,
  opt_state: Any,
  x_test: np.ndarray,
  y_test: np.ndarray,
  workdir: str | None,
  timing_rounds: int = 20,
) -> ChannelResult:
  """Shrinks the trained model, exports it, and measures it.

  Args:
    rule: the run's `ChannelRule`.
    model: the Flax module.
    params: the trained params (masked channels are zero).
    opt_state: the optimizer state holding the pruning state.
    x_test: test images.
    y_test: test labels.
    workdir: where `pruned_model.bin` goes; None writes nothing.
    timing_rounds: timed calls of each model.

  Returns:
    The `ChannelResult`.
  """
  import jaxprune.channels
  from jaxprune.structured._shared import dense_distance

  input_shape = tuple(x_test.shape[1:])
  shrunk = jaxprune.channels.shrink(rule, {'params': params}, opt_state, _example(input_shape))
  blob = export_bytes(shrunk.pruned_fn, shrunk.variables, input_shape)
  path = None
  if workdir is not None:
    path = os.path.join(workdir, MODEL_FILE)
    # Written whole, then renamed: a reader never sees half an artifact, and a
    # full disk leaves no partial file behind.
    files.atomic_write(path, blob)
  exported = jax.export.deserialize(bytearray(blob))
  logits = np.concatenate(
    [
      np.asarray(exported.call(jnp.asarray(x_test[i : i + 1024])))
      for i in range(0, len(x_test), 1024)
    ]
  )
  accuracy = float(np.mean(np.argmax(logits, -1) == y_test))
  dense = jax.jit(model.apply)
  trained = np.concatenate(
    [
      np.asarray(dense({'params': params}, jnp.asarray(x_test[i : i + 1024])))
      for i in range(0, len(x_test), 1024)
    ]
  )
  # The job's models run on their params alone: no BatchNorm statistics to re-estimate.
  vs_trained = dense_distance([trained], [logits], 'the test split', batch_norm=False)
  batch = jnp.asarray(np.resize(x_test, (TIMING_BATCH, *input_shape)))
  small = jax.jit(exported.call)
  seconds = _median_seconds(
    {'dense': lambda: dense({'params': params}, batch), 'shrunk': lambda: small(batch)},
    timing_rounds,
  )
  plan = shrunk.plan
  groups = [
    (g.label, int(g.size - len(plan.removed.get(g.id, ()))), g.size) for g in rule.layout.groups
  ]
  # The graph was traced on two images.
  return ChannelResult(
    groups,
    shrunk.flops_before / 2,
    shrunk.flops_after / 2,
    seconds['dense'] / seconds['shrunk'],
    accuracy,
    path,
    vs_trained,
  )
