"""`jaxprune-train`: train and prune a Flax model from an ml_collections config.

    jaxprune-train                                   # the default: MLP on digits, GMP to 90%
    jaxprune-train --config configs/digits_cnn.py --workdir runs/cnn
    jaxprune-train --config configs/lm.py             # a byte-level language model
    jaxprune-train --config.pruning.target_sparsity=0.95
    jaxprune-train --config.pruning.weight_sparsity_map="['Dense_0/kernel:0.5']"
    jaxprune-train --pruning_hparams="target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]"

In every process of a multi-process job (docs/guides/sharding.md#running-on-many-hosts):

    jaxprune-train --config.mesh_shape="(2,4)" --coordinator_address=HOST0:1234
                   --num_processes=2 --process_id=0      # 1 in the other process

Rerunning with the `--workdir` of an earlier run resumes it from its newest
checkpoint (the config must be the same, up to `num_steps` and how often it
logs, evaluates and checkpoints).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from jaxprune._config import hparams as hparams_lib
from jaxprune._config.maps import split_top_level
from jaxprune_train import _defaults as defaults
from jaxprune_train import _errors as errors
from jaxprune_train import _process as process
from jaxprune_train import _usage as usage
from jaxprune_train._entry import PROGRAM, STARTING

_HELP = {
  'config': 'An ml_collections config file (e.g. configs/digits_cnn.py); the default '
  'trains a 300-100 MLP on digits and prunes it to 90% sparsity. Fields can '
  'be overridden: --config.pruning.target_sparsity=0.95.',
  'workdir': 'Output directory (checkpoints, metrics, plots); default runs/<config.name>. '
  'The workdir of an earlier run resumes that run.',
  'pruning_hparams': 'TF model_pruning HParams string applied on top of config.pruning, '
  'e.g. "target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]".',
  'coordinator_address': 'Multi-process jobs: host:port of process 0, the same in every '
  'process (found by JAX on SLURM, Open MPI and TPU pod slices).',
  'num_processes': 'Multi-process jobs: the number of processes (1: a one-process run).',
  'process_id': "Multi-process jobs: this process's index, 0 to num_processes - 1.",
  'heartbeat_timeout_seconds': 'Multi-process jobs: how long a silent (dead) process is '
  'waited for before the others stop (default 100).',
  'initialization_timeout_seconds': 'Multi-process jobs: how long after its start a process '
  'waits for the others to join; then it stops with one line (default 25).',
}


class _Flags(NamedTuple):
  config: flags.FlagHolder
  workdir: flags.FlagHolder
  pruning_hparams: flags.FlagHolder
  coordinator_address: flags.FlagHolder
  num_processes: flags.FlagHolder
  process_id: flags.FlagHolder
  heartbeat_timeout_seconds: flags.FlagHolder
  initialization_timeout_seconds: flags.FlagHolder


def _define_flags() -> _Flags:
  # Defined when the command runs rather than at import: without --config,
  # ml_collections loads the default config and applies the --config.*
  # overrides of sys.argv right here, and its errors must become one line too.
  return _Flags(
    config_flags.DEFINE_config_file(
      'config', usage.DEFAULT_CONFIG, _HELP['config'], lock_config=False
    ),
    flags.DEFINE_string('workdir', None, _HELP['workdir']),
    flags.DEFINE_string('pruning_hparams', '', _HELP['pruning_hparams']),
    flags.DEFINE_string('coordinator_address', None, _HELP['coordinator_address']),
    flags.DEFINE_integer('num_processes', None, _HELP['num_processes'], lower_bound=1),
    flags.DEFINE_integer('process_id', None, _HELP['process_id'], lower_bound=0),
    flags.DEFINE_integer(
      'heartbeat_timeout_seconds', 100, _HELP['heartbeat_timeout_seconds'], lower_bound=1
    ),
    flags.DEFINE_integer(
      'initialization_timeout_seconds', 25, _HELP['initialization_timeout_seconds'], lower_bound=1
    ),
  )


def _fail(message: str) -> NoReturn:
  """Prints `jaxprune-train: <message>` as one line on stderr and exits with status 1."""
  sys.exit(f'{PROGRAM}: {errors.one_line(message)}')


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
  del category, filename, lineno, file, line
  print(f'{PROGRAM}: warning: {errors.one_line(str(message))}', file=sys.stderr)


def _route_warnings() -> None:
  """Shows each warning as one line, less the reports of the checkpoint reads and writes
  orbax abandons when one of them fails (`_process.quiet_abandoned_io`)."""
  warnings.showwarning = _show_warning
  process.quiet_abandoned_io()


def _parse_flags(argv: list[str], config: flags.FlagHolder) -> list[str]:
  """absl's flag parsing, with one-line errors."""
  try:
    rest = flags.FLAGS(argv)
    # A config file that fails to load only raises once the config is used.
    usage.ensure_loaded(config.value)
  except Exception as err:  # noqa: BLE001 -- every parse failure is described in one line
    _fail(usage.describe_flag_error(err, argv))
  return rest


def main(argv: Sequence[str], defined: _Flags) -> None:
  """Runs the job described by the flags."""
  from jaxprune_train import _join as join

  if len(argv) > 1:
    _fail(
      f'unexpected arguments {argv[1:]}; flags take the form --name=value '
      f'({PROGRAM} --help lists them).'
    )
  if defined.workdir.value == '':
    _fail(
      '--workdir is empty; give the directory of the run (e.g. --workdir=runs/mine), or '
      'leave the flag out for runs/<config.name>.'
    )
  if not flags.FLAGS['verbosity'].present:
    # Orbax logs every checkpoint step, and its failures at length; the job
    # reports them itself, in one line. --verbosity=0 shows the logs.
    logging.set_verbosity(logging.FATAL)
  _route_warnings()
  _join_processes(defined, join)  # first thing that touches JAX's devices
  # The job's modules (Flax, orbax, matplotlib, the structured pass) load once the flags
  # have parsed: a mistyped flag, a bad config file or --help is answered in a second.
  from jaxprune_train import _agreement as agreement
  from jaxprune_train import _cache as compilation_cache
  from jaxprune_train import _channels as channels
  from jaxprune_train import _distributed as distributed
  from jaxprune_train import _loop as loop
  from jaxprune_train import _plots as plots
  from jaxprune_train import _report as report
  from jaxprune_train._metrics import METRICS_FILE

  config = defined.config.value
  problem = _resolve_pruning(
    config, _pruning_set_by_flags(defined.config), defined.pruning_hparams.value
  )
  workdir = defined.workdir.value or os.path.join('runs', str(config.get('name', 'run')))
  job_flags = {
    'num_processes': defined.num_processes.value,
    'heartbeat_timeout_seconds': defined.heartbeat_timeout_seconds.value,
  }
  try:
    # Also with a problem of this process's own: the others then stop naming it.
    agreement.check_same(
      agreement.run_settings(config, workdir, job_flags),
      defined.initialization_timeout_seconds.value,
      problem,
    )
  except errors.RunError as err:
    _fail(str(err))
  num_steps = config.get('num_steps')
  process.end_at_once(lambda: f'{PROGRAM}: {_interrupted(workdir, num_steps)}')
  try:
    print(f'{PROGRAM}: config {config.get("name")!r}, workdir {workdir}')
    print(f'{PROGRAM}: {compilation_cache.enable(workdir)}')
    result = distributed.guarded(loop.train, config, workdir)
  except errors.RunError as err:
    _fail(str(err))
  except KeyboardInterrupt:
    newest = _newest_checkpoint(workdir)
    if newest is None or newest >= num_steps:
      os.write(2, b'\n')  # off the progress bar's line
      process.stop(f'{PROGRAM}: {_interrupted(workdir, num_steps)}', 130)
    print(
      f'\nInterrupted; run the same command again to resume from the newest checkpoint '
      f'in {workdir} (training writes one when interrupted).',
      file=sys.stderr,
    )
    sys.exit(130)
  print()
  print(report.format_report(result.report))
  outputs = [loop.REPORT_FILE, METRICS_FILE, 'checkpoints/']
  if config.prune and config.channels.enabled:
    outputs.append(channels.MODEL_FILE)
  if config.tensorboard and os.path.isdir(os.path.join(workdir, 'tensorboard')):
    outputs.append('tensorboard/')  # not without tensorboardX (the job warned)
  if config.plots:
    outputs += [plots.SPARSITY_PNG, plots.ACCURACY_PNG]
    if result.report.leaves:
      outputs.append(plots.LAYERS_PNG)
    if result.report.bits_per_byte is not None:
      outputs.append(plots.BITS_PNG)
  print(f'\nOutputs in {os.path.abspath(workdir)}: {", ".join(outputs)}')


def _pruning_set_by_flags(config: flags.FlagHolder) -> dict[str, Any]:
  """The pruning fields the `--config.pruning.<field>` flags set, with their values."""
  overrides = config_flags.get_override_values(flags.FLAGS[config.name])
  prefix = 'pruning.'
  return {k[len(prefix) :]: v for k, v in overrides.items() if k.startswith(prefix)}


def _resolve_pruning(
  config: ml_collections.ConfigDict, by_flags: Mapping[str, Any], hparams_text: str
) -> str | None:
  """Applies --pruning_hparams to `config.pruning`; what is wrong with them, or None.

  Args:
    config: the job's config, with the `--config.*` flags applied.
    by_flags: the pruning fields that `--config.pruning.*` flags set (`_pruning_set_by_flags`).
    hparams_text: the `--pruning_hparams` flag, applied last.
  """
  ignored = [f'--config.pruning.{name}={value}' for name, value in by_flags.items()]
  ignored += [f'--pruning_hparams={hparams_text}'] if hparams_text else []
  if config.get('prune') is False and ignored:
    return (
      f'{ignored[0]} has no effect: config.prune=False trains the dense model only; '
      'drop the pruning flags, or set --config.prune=True.'
    )
  # A config without a pruning block is reported by train(), with the other fields.
  if isinstance(config.get('pruning'), ml_collections.ConfigDict):
    try:
      by_text = {
        name.strip(): value.strip()
        for name, _, value in (item.partition('=') for item in split_top_level(hparams_text))
      }
      pruning = _nm_in_place_of_target(config.pruning, {**by_flags, **by_text})
      config.pruning = (
        defaults.parse_pruning_flag(hparams_text, pruning)
        if hparams_text
        else defaults.pruning_config(pruning)
      )
    except (ValueError, TypeError) as err:
      return str(err)
  return None


def _nm_in_place_of_target(
  pruning: ml_collections.ConfigDict, command_line: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """`pruning`, with its target_sparsity back at the field's default and no longer given
  when the command line sets an N:M pattern and no target.

  N:M beside a target is refused (the target would be dropped), but the config file's
  target (the default config's 0.9) is not one the command line gave:
  `--config.pruning.nm_sparsity=2:4` asks for 2:4 in its place. A target on the command
  line as well is still refused, whatever its value.

  Args:
    pruning: the config's pruning block.
    command_line: the pruning fields the command line sets, with their values.
  """
  if 'target_sparsity' in command_line or not command_line.get('nm_sparsity'):
    return pruning  # no N:M on the command line, or N:M set to '' (none): the target stays
  return hparams_lib.PruningConfig(
    {**pruning.to_dict(), 'target_sparsity': hparams_lib.HParams.target_sparsity},
    given=hparams_lib.given_fields(pruning) - {'target_sparsity'},
  )


def _join_processes(defined: _Flags, join: Any) -> None:
  """Joins the other processes of a multi-process job (before JAX starts its devices).

  Process 0 prints as one process does; the others print one line, then only
  their errors.
  """
  try:
    join.initialize(
      defined.coordinator_address.value,
      defined.num_processes.value,
      defined.process_id.value,
      defined.heartbeat_timeout_seconds.value,
      defined.initialization_timeout_seconds.value,
    )
  except errors.RunError as err:
    _fail(str(err))
  from jaxprune_train import _distributed as distributed

  if not distributed.multiprocess():
    return
  print(
    f'{PROGRAM}: {distributed.describe()}'
    + (
      ''
      if distributed.is_primary()
      else '; process 0 prints the report and writes the metrics, the report and the plots'
    ),
    flush=True,
  )
  if not distributed.is_primary():
    sys.stdout = open(os.devnull, 'w')  # noqa: SIM115 -- for the life of the process
    warnings.simplefilter('ignore')  # process 0 shows the same warnings


def _newest_checkpoint(workdir: str) -> int | None:
  """The step of the newest complete checkpoint in `workdir` (orbax renames each into
  place once written), or None."""
  try:
    names = os.listdir(os.path.join(workdir, 'checkpoints'))
  except OSError:
    return None
  # Orbax writes each into `<step>.orbax-checkpoint-tmp-<n>` first.
  return max((int(name) for name in names if name.isdigit()), default=None)


def _interrupted(workdir: str, num_steps: Any) -> str:
  """The line for a Ctrl-C that ends the job at once, by what the workdir holds."""
  newest = _newest_checkpoint(workdir)
  if newest is None:
    return (
      f'interrupted before the first checkpoint of {workdir}; run the same command again '
      'to start the run.'
    )
  if isinstance(num_steps, int) and newest >= num_steps:
    return (
      f'interrupted after the last checkpoint (step {newest}): the run in {workdir} is '
      'complete; the same command again writes its report.'
    )
  return (
    f'interrupted; run the same command again to resume from the newest checkpoint '
    f'(step {newest}) in {workdir}.'
  )


def run() -> None:
  """Console-script entry point (`jaxprune-train`)."""
  process.end_at_once(lambda: f'{PROGRAM}: {STARTING}')
  argv = sys.argv
  if any(arg in usage.HELP_FLAGS for arg in argv[1:]) or '--helpfull' in argv[1:]:
    print(usage.help_text(__doc__, [f'  --{name}: {text}' for name, text in _HELP.items()], argv))
    if '--helpfull' in argv[1:]:
      print('\nAll flags (absl, JAX and the libraries):\n' + flags.FLAGS.get_help())
    sys.exit(0)
  repeated = usage.repeated_flag(argv)
  if repeated is not None:
    _fail(repeated)
  try:
    defined = _define_flags()
  except Exception as err:  # noqa: BLE001 -- every parse failure is described in one line
    _fail(usage.describe_flag_error(err, argv))
  app.run(
    functools.partial(main, defined=defined),
    flags_parser=functools.partial(_parse_flags, config=defined.config),
  )
