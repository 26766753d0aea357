"""`jaxprune-train`: train and prune a Flax model from an ml_collections config.

    jaxprune-train                                   # the default: MLP on digits, GMP to 90%
    jaxprune-train --config configs/digits_cnn.py --workdir runs/cnn
    jaxprune-train --config.pruning.target_sparsity=0.95
    jaxprune-train --config.pruning.weight_sparsity_map="['Dense_0/kernel:0.5']"
    jaxprune-train --pruning_hparams="target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]"

Rerunning with the `--workdir` of an earlier run resumes it from its newest
checkpoint (the config must be the same, up to `num_steps` and how often it
logs, evaluates and checkpoints).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from jaxprune.train import checkpoints, defaults, loop, plots, report
from jaxprune.train.metrics import METRICS_FILE

_CONFIG = config_flags.DEFINE_config_file(
    'config', os.path.join(os.path.dirname(__file__), 'defaults.py'),
    'An ml_collections config file (e.g. configs/digits_cnn.py); the default '
    'trains a 300-100 MLP on digits and prunes it to 90% sparsity. Fields can '
    'be overridden: --config.pruning.target_sparsity=0.95.',
    lock_config=False)
_WORKDIR = flags.DEFINE_string(
    'workdir', None,
    'Output directory (checkpoints, metrics, plots); default runs/<config.name>. '
    'The workdir of an earlier run resumes that run.')
_PRUNING_HPARAMS = flags.DEFINE_string(
    'pruning_hparams', '',
    'TF model_pruning HParams string applied on top of config.pruning, e.g. '
    '"target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]".')


def main(argv: Sequence[str]) -> None:
  """Runs the job described by the flags."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}; use --flag=value.')
  if not flags.FLAGS['verbosity'].present:
    # Orbax and JAX log every checkpoint step at INFO; --verbosity=0 shows it.
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  try:
    config.pruning = (defaults.parse_pruning_flag(_PRUNING_HPARAMS.value, config.pruning)
                      if _PRUNING_HPARAMS.value else defaults.pruning_config(config.pruning))
  except ValueError as err:
    raise app.UsageError(f'Bad pruning config: {err}') from None
  workdir = _WORKDIR.value or os.path.join('runs', config.name)
  print(f'jaxprune-train: config {config.name!r}, workdir {workdir}')
  try:
    result = loop.train(config, workdir)
  except checkpoints.IncompatibleWorkdirError as err:
    sys.exit(f'jaxprune-train: {err}')
  except KeyboardInterrupt:
    print(f'\nInterrupted; progress is checkpointed in {workdir}. Run the same '
          'command again to resume.', file=sys.stderr)
    sys.exit(130)
  print()
  print(report.format_report(result.report))
  outputs = [loop.REPORT_FILE, METRICS_FILE, 'checkpoints/']
  if config.tensorboard:
    outputs.append('tensorboard/')
  if config.plots:
    outputs += [plots.SPARSITY_PNG, plots.ACCURACY_PNG]
    if result.report.leaves:
      outputs.append(plots.LAYERS_PNG)
  print(f'\nOutputs in {os.path.abspath(workdir)}: {", ".join(outputs)}')


def run() -> None:
  """Console-script entry point (`jaxprune-train`)."""
  # absl's --help lists the flags of the program file (sys.argv[0]); ours are
  # defined in this module, so register them for it.
  for name in ('config', 'workdir', 'pruning_hparams'):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  app.run(main)
