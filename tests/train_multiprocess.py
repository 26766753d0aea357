"""Multi-process runs of the main job for the tests: launching, killing, and a comparison script.

As a script, `python train_multiprocess.py NUM_PROCESSES PROCESS_ID PORT OUTDIR`
trains the tiny config (`train_faults.tiny_config`, on a 2x4 mesh) and a tiny
channel-pruning CNN, and process 0 saves the params just past the first mask
update that prunes and at the end in `OUTDIR/<config>-<step>.npz`. PORT '0' runs one process with
JAX's default CPU collectives; any other port joins the processes with
`jax.distributed` over 127.0.0.1 and gloo (also for one process, so that a
one-process run sums across devices exactly as the multi-process one does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import cpu_devices

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The step after the first mask update that prunes (step 30; the one at 20 is at 0%),
# and the end of the run.
STEPS = (31, 60)


def free_port() -> int:
  """A TCP port no one listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def env(devices: int) -> dict[str, str]:
  """The environment of a process with `devices` CPU devices that imports this checkout."""
  return cpu_devices.env(devices, PYTHONPATH=ROOT, PYTHONUNBUFFERED='1')


@contextlib.contextmanager
def processes(
  commands: Sequence[Sequence[str]], devices: int, logdir: str, name: str
) -> Iterator[list[subprocess.Popen]]:
  """Starts one process per command, stdout/stderr in `logdir/<name>.<i>.{out,err}`.

  Whatever is still running when the block ends is killed (SIGKILL) and reaped.
  """
  started = []
  try:
    for i, command in enumerate(commands):
      out = open(os.path.join(logdir, f'{name}.{i}.out'), 'w')  # noqa: SIM115
      err = open(os.path.join(logdir, f'{name}.{i}.err'), 'w')  # noqa: SIM115
      started.append(
        subprocess.Popen(command, stdout=out, stderr=err, env=env(devices), cwd=logdir)
      )
      out.close()
      err.close()
    yield started
  finally:
    for process in started:
      if process.poll() is None:
        process.send_signal(signal.SIGKILL)
      process.wait()


def wait_all(started: Sequence[subprocess.Popen], timeout: float) -> list[int]:
  """The exit statuses, once all have ended; raises TimeoutError after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  for process in started:
    process.wait(max(1.0, deadline - time.monotonic()))
  return [process.returncode for process in started]


def read(logdir: str, name: str, i: int, stream: str = 'err') -> str:
  with open(os.path.join(logdir, f'{name}.{i}.{stream}')) as f:
    return f.read()


def configs() -> dict[str, Any]:
  """`{name: get_config(num_steps)}`: the tiny MLP and a tiny channel-pruning CNN, on 2x4."""
  sys.path.insert(0, HERE)
  from train_faults import tiny_config

  def mlp(num_steps: int) -> Any:
    return tiny_config(num_steps, prune_steps=(20, 50), eval_every=30, mesh_shape=(2, 4))

  def cnn(num_steps: int) -> Any:
    config = mlp(num_steps)
    config.model.name = 'cnn'
    config.model.features = (16, 32)
    config.model.dense = 16
    config.pruning.target_sparsity = 0.5
    config.channels.enabled = True
    return config

  return {'mlp': mlp, 'channels': cnn}


def main(argv: list[str]) -> None:
  num_processes, process_id, port, outdir = int(argv[1]), int(argv[2]), argv[3], argv[4]
  import jax

  if port != '0':
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(f'127.0.0.1:{port}', num_processes, process_id)
  import numpy as np

  from jaxprune_train import _distributed as distributed
  from jaxprune_train import _loop as loop

  def save(name: str, step: int, state: Any) -> None:
    params = jax.device_get(distributed.host_copy(state.params))  # all processes gather
    if process_id == 0:
      flat, _ = jax.tree_util.tree_flatten_with_path(params)
      np.savez(
        os.path.join(outdir, f'{name}-{step}.npz'),
        **{jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat},
      )

  for name, get_config in configs().items():

    def on_step(step: int, state: Any, name: str = name) -> None:
      if step == STEPS[0]:
        save(name, step, state)

    state = loop.train(get_config(STEPS[1]), os.path.join(outdir, name), on_step=on_step).state
    save(name, STEPS[1], state)


if __name__ == '__main__':
  main(sys.argv)
