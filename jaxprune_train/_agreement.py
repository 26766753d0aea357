"""The processes of a job agree on the run before it starts, or all stop with one line.

Each process of a multi-process job is started with its own flags. Before
anything is trained, each puts the settings that define the run (the
resolved config, the workdir, the job's flags that must match) in the
key-value store of JAX's coordination service and reads every other
process's; where two differ, every process raises the same `ConfigError`,
naming the first differing setting and both values. The flags that may
differ (`--process_id`, `--coordinator_address`, which may name process 0's
machine in more than one way, `--initialization_timeout_seconds`, the path
of `--config`, logging) are listed in docs/guides/main_job.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from jaxprune_train import _distributed as distributed
from jaxprune_train import _process as process_lib
from jaxprune_train._entry import PROGRAM
from jaxprune_train._errors import ConfigError

_KEY = 'jaxprune_train/settings'


def _flatten(config: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  settings = {}
  for key, value in config.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      settings.update(_flatten(value, f'{prefix}{key}.'))
    else:
      settings[f'{prefix}{key}'] = value
  return settings


def run_settings(
  config: ml_collections.ConfigDict, workdir: str, job_flags: Mapping[str, Any]
) -> dict[str, str]:
  """What defines the run, `{flag: repr of its value}`: the job's flags, the workdir and
  every field of the resolved config (after --pruning_hparams)."""
  settings = {f'--{name}': repr(value) for name, value in job_flags.items()}
  settings['--workdir'] = repr(os.path.abspath(workdir))
  settings.update({name: repr(value) for name, value in _flatten(config, '--config.').items()})
  return settings


def _first_difference(everyone: list[dict[str, str]]) -> str | None:
  """'--config.seed: 0 in process 0, 1 in process 1 (and ...)', or None when all agree."""
  first = everyone[0]
  for process, settings in enumerate(everyone[1:], start=1):
    names = [n for n in {**first, **settings} if first.get(n) != settings.get(n)]
    if names:
      name = names[0]
      more = f' (and {len(names) - 1} more: {", ".join(names[1:4])}' if len(names) > 1 else ''
      more += ', ...)' if len(names) > 4 else (')' if more else '')
      return (
        f'{name}: {first.get(name, "not given")} in process 0, '
        f'{settings.get(name, "not given")} in process {process}{more}'
      )
  return None


def check_same(settings: dict[str, str], timeout_seconds: float, problem: str | None) -> None:
  """Raises ConfigError, in every process, unless every process has the same `settings`.

  A collective: every process of the job calls it, before training. In one
  process, it raises `problem` if there is one, and else does nothing.

  Args:
    settings: this process's `run_settings`.
    timeout_seconds: how long to wait for the other processes' settings; a
      process that sends none by then is gone, and this one stops with the
      lost-process line.
    problem: what is wrong with this process's flags, found after joining
      (the others are told, and stop naming this process), or None.

  Raises:
    ConfigError: `problem`; another process's problem; or the processes were
      given different settings.
  """
  if distributed.multiprocess():
    everyone = _exchange({'settings': settings, 'problem': problem}, timeout_seconds)
  else:
    everyone = [{'settings': settings, 'problem': problem}]
  if problem is not None:
    raise ConfigError(problem)
  for process, sent in enumerate(everyone):
    if sent['problem'] is not None:
      raise ConfigError(
        f'process {process} of the job stopped ({sent["problem"]}); fix its flags and '
        'start every process again.'
      )
  difference = _first_difference([sent['settings'] for sent in everyone])
  if difference is not None:
    raise ConfigError(
      f'the processes of this job were given different settings: {difference}. Give every '
      'process the same flags and config; only --process_id and the flags the main-job '
      "guide lists under 'Flags of each process' may differ."
    )


def _exchange(mine: dict[str, Any], timeout_seconds: float) -> list[dict[str, Any]]:
  """What every process sent, by process id (through JAX's key-value store)."""
  from jax._src import distributed as jax_distributed

  client = jax_distributed.global_state.client
  me = jax.process_index()
  client.key_value_set(f'{_KEY}/{me}', json.dumps(mine))
  everyone = []
  interrupted = f'{PROGRAM}: interrupted while joining the job; nothing was written.'
  with process_lib.watchdog(None, '', interrupted):  # Ctrl-C while JAX waits: at once
    for process in range(jax.process_count()):
      if process == me:
        everyone.append(mine)
        continue
      try:
        text = client.blocking_key_value_get(f'{_KEY}/{process}', int(timeout_seconds * 1000))
      except Exception as err:  # noqa: BLE001 -- JAX's runtime error: the process is gone
        distributed.stop_lost(
          f'process {process} did not send its settings within {timeout_seconds:g} s: {err}'
        )
      everyone.append(json.loads(text))
  return everyone
