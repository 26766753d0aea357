"""Device memory of one-shot pruning a model larger than memory, 4 blocks vs 32 of one width.

The blocks are those of `benchmarks/charlm.py` (RMSNorm, causal attention, SwiGLU MLP),
their params on the host as numpy arrays, pruned by `oneshot.prune_offloaded` (Wanda 2:4 and
SparseGPT 50%) from calibration activations. The device memory measured is the peak of the
bytes of all live JAX arrays (`jax.live_arrays()`, every array on the device, host numpy
arrays not included), sampled every millisecond by a thread while pruning runs, plus the
largest temporary buffer of the compiled block forward (`memory_analysis()`): on the CPU
`memory_stats()` is None, and process RSS would count the params on the host. For contrast,
the same measure for the in-memory `oneshot.prune` of the whole model (params on the
device) at 4 blocks (and at 32 with `--in-memory-32`, minutes more).

    python -m benchmarks.oneshot_offload            # about 2.5 CPU minutes on 2 cores
"""

from __future__ import annotations

import argparse
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import charlm
from jaxprune import oneshot

WIDTH, HEADS, HIDDEN = 128, 4, 384
CALIBRATION = (4, 8, 64)  # batches x batch size x tokens: 2k tokens
RUNS = {
  'wanda 2:4': dict(method='wanda', nm='2:4'),
  'sparsegpt 50%': dict(method='sparsegpt', sparsity=0.5),
}


def live_bytes() -> int:
  """Bytes of every live JAX array (each buffer once)."""
  return sum(a.nbytes for a in {id(a): a for a in jax.live_arrays()}.values())


class PeakSampler:
  """The largest `live_bytes()` seen, sampled by a thread while the `with` body runs."""

  def __init__(self, every: float = 0.001):
    self.every, self.peak, self._stop = every, 0, threading.Event()

  def _loop(self) -> None:
    while not self._stop.is_set():
      self.peak = max(self.peak, live_bytes())
      time.sleep(self.every)

  def __enter__(self) -> PeakSampler:
    self.peak = live_bytes()
    self._thread = threading.Thread(target=self._loop, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, live_bytes())


def host_blocks(depth: int) -> list:
  """`depth` blocks' params drawn at random, as numpy arrays on the host."""
  block = charlm.Block(WIDTH, HEADS, HIDDEN)
  x = jnp.zeros((1, CALIBRATION[2], WIDTH))
  init = jax.jit(block.init)
  # Copies: `np.asarray` of a CPU array is a view that keeps the JAX array alive.
  return [jax.tree.map(np.array, init(jax.random.key(i), x)['params']) for i in range(depth)]


def calibration() -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  count, batch, tokens = CALIBRATION
  return [rng.normal(size=(batch, tokens, WIDTH)).astype(np.float32) for _ in range(count)]


def forward_temp_bytes(blocks: list) -> int:
  """Temporary bytes of the compiled forward of one block (what XLA allocates inside it)."""
  fn = lambda p, x: charlm.Block(WIDTH, HEADS, HIDDEN).apply({'params': p}, x)
  compiled = jax.jit(fn).lower(blocks[0], calibration()[0]).compile()
  analysis = compiled.memory_analysis()
  return int(analysis.temp_size_in_bytes) if analysis is not None else 0


def offloaded_peak(depth: int, options: dict) -> tuple[int, float]:
  blocks, batches = host_blocks(depth), calibration()
  block = charlm.Block(WIDTH, HEADS, HIDDEN)
  start = time.perf_counter()
  with PeakSampler() as sampler:
    oneshot.prune_offloaded(block, blocks, batches, **options)
  return sampler.peak, time.perf_counter() - start


def in_memory_peak(depth: int, options: dict) -> tuple[int, float]:
  blocks, batches = host_blocks(depth), calibration()

  def fn(params, x):
    for p in params:
      x = charlm.Block(WIDTH, HEADS, HIDDEN).apply({'params': p}, x)
    return x

  params = jax.device_put(blocks)
  start = time.perf_counter()
  with PeakSampler() as sampler:
    oneshot.prune(fn, params, batches, **options)
  return sampler.peak, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--in-memory-32', action='store_true', help='also oneshot.prune at 32')
  args = parser.parse_args(argv)
  params_mb = sum(a.nbytes for a in jax.tree.leaves(host_blocks(1))) / 2**20
  temp_mb = forward_temp_bytes(host_blocks(1)) / 2**20
  print(
    f'blocks of width {WIDTH}, MLP {HIDDEN}: {params_mb:.2f} MiB of params each; '
    f'calibration {CALIBRATION[0]} x {CALIBRATION[1]} x {CALIBRATION[2]} tokens; '
    f'compiled block forward temporaries {temp_mb:.2f} MiB'
  )
  print(
    '| run | params on host | peak live device MiB, 4 blocks | 32 blocks | ratio | time 4 / 32 |'
  )
  print('|---|---|---|---|---|---|')
  for name, options in RUNS.items():
    (p4, t4), (p32, t32) = offloaded_peak(4, options), offloaded_peak(32, options)
    print(
      f'| prune_offloaded {name} | {4 * params_mb:.0f} / {32 * params_mb:.0f} MiB | '
      f'{p4 / 2**20:.2f} | {p32 / 2**20:.2f} | {p32 / p4:.3f}x | {t4:.0f} s / {t32:.0f} s |'
    )
  name, options = next(iter(RUNS.items()))
  p4, t4 = in_memory_peak(4, options)
  if args.in_memory_32:
    p32, t32 = in_memory_peak(32, options)
    tail = f'{p32 / 2**20:.2f} | {p32 / p4:.3f}x | {t4:.0f} s / {t32:.0f} s |'
  else:
    tail = f'(not run) | | {t4:.0f} s / |'
  print(f'| in-memory prune {name} | (on the device) | {p4 / 2**20:.2f} | {tail}')


if __name__ == '__main__':
  main()
