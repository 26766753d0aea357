"""The training loop: data, model, jitted step, evaluation, checkpoints, outputs.

A run has two phases. Setting up (the config's fields, the data, the mesh,
the workdir's lock and config, the newest good checkpoint) turns every
problem with the inputs into a one-line `RunError` before anything is
written. Training then stops with a `RunError` only for what the user can
act on: a loss or state that is no longer finite (`DivergedError`; such a
state is never checkpointed) and a write that fails for lack of space
(`StorageError`; the older checkpoints are intact).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from jaxprune_train import _channels as channels
from jaxprune_train import _checkpoints as checkpoints
from jaxprune_train import _data as data
from jaxprune_train import _distributed as distributed
from jaxprune_train import _files as files
from jaxprune_train import _models as models
from jaxprune_train import _plots as plots
from jaxprune_train import _process as process
from jaxprune_train import _progress as progress
from jaxprune_train import _report as report
from jaxprune_train import _sharding as sharding
from jaxprune_train import _stats as stats
from jaxprune_train import _validate as validate
from jaxprune_train import _workdir as workdir_lib
from jaxprune_train._errors import ConfigError, DivergedError, one_line
from jaxprune_train._metrics import METRICS_FILE, MetricsWriter
from jaxprune_train._step import (
  TrainState,
  create_train_state,
  make_evaluate,
  make_optimizer,
  make_train_step,
)

REPORT_FILE = 'report.txt'


class TrainResult(NamedTuple):
  """What `train` returns.

  Attributes:
    state: the final train state.
    report: the final report (per pruned leaf, totals, accuracies).
    history: every metric record of the run, as in `metrics.jsonl`.
    workdir: where the outputs went (None when nothing was written).
  """

  state: TrainState
  report: report.RunReport
  history: list[dict[str, Any]]
  workdir: str | None


class _Job(NamedTuple):
  """What a run is built from: everything but the state it trains."""

  config: ml_collections.ConfigDict
  dataset: data.Dataset
  state: TrainState
  train_step: Callable
  evaluate: Callable
  model: Any
  rule: channels.ChannelRule | None  # with config.channels.enabled
  feed: Callable[[int], Any]  # step -> the batch (this process's rows of it)


def _build(config: ml_collections.ConfigDict) -> _Job:
  """Loads the data, builds the model and the jitted step; ConfigError for bad inputs."""
  try:
    dataset = data.load_dataset(
      config.data.name,
      config.data.path,
      config.data.seed,
      config.data.test_fraction,
      seq_len=config.data.seq_len,
      test_windows=config.data.test_windows,
    )
    data.steps_per_epoch(len(dataset.y_train), config.batch_size)
    distributed.check_mesh(config.mesh_shape)
    mesh = sharding.make_mesh(config.mesh_shape)
    sharding.check_batch(mesh, config.batch_size)
    model = models.create_model(config.model, dataset.num_classes)
  except (ValueError, OSError) as err:
    raise ConfigError(one_line(str(err))) from err
  try:
    params = models.init_params(model, dataset.x_train.shape[1:], config.seed)
    rule = channels.make_rule(config, model, params, tuple(dataset.x_train.shape[1:]))
    tx = make_optimizer(config, rule)
    # tx.init checks the hparams that depend on the params' shapes (N:M, layer axes).
    initial = create_train_state(params, tx)
  except (ValueError, TypeError) as err:
    raise ConfigError(one_line(str(err))) from err
  # Placed first, so that a checkpoint is restored straight into these shards.
  state = sharding.place(initial, mesh)
  # The one place the step is jitted: everything it needs is in its arguments.
  train_step = sharding.jit_train_step(
    make_train_step(model.apply, tx), mesh, state, config.batch_size
  )
  feed = distributed.batch_feed(dataset, config.seed, config.batch_size, mesh)
  return _Job(config, dataset, state, train_step, make_evaluate(model.apply), model, rule, feed)


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
  return jnp.all(
    jnp.stack(
      [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(x.dtype, jnp.inexact)
      ]
    )
  )


def train(
  config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  on_step: Callable[[int, TrainState], None] | None = None,
) -> TrainResult:
  """Trains (and prunes) the model of `config`, resuming from `workdir`.

  Args:
    config: a training config, `jaxprune_train.get_config()` with your changes.
    workdir: directory for checkpoints, `metrics.jsonl`, TensorBoard events,
      the report and plots. If it holds a checkpoint of the same config, the
      run resumes from its newest good checkpoint. None writes nothing.
    on_step: called as `on_step(step, state)` after each train step.

  Returns:
    A `TrainResult`.

  Raises:
    ConfigError: a config field, the data, the mesh or the workdir does not
      fit (`IncompatibleWorkdirError` when the workdir holds another run).
    WorkdirBusyError: another run is using `workdir`.
    DamagedCheckpointError: `workdir` has checkpoints but none reads back intact.
    DivergedError: the loss or the state stopped being finite.
    StorageError: a file could not be written (disk full, quota, permissions).
  """
  validate.check_config(config)
  job = _build(config)
  if workdir is None:
    return _Run(job, None).run(on_step)
  with distributed.locked(workdir):
    return _Run(job, workdir).run(on_step)


class _Run:
  """One run of a job: its state, its checkpoints and its outputs."""

  def __init__(self, job: _Job, workdir: str | None):
    self.job, self.config, self.workdir = job, job.config, workdir
    # With several processes, process 0 alone writes the run's files (the checkpoints: all).
    self.writes = workdir is not None and distributed.is_primary()
    self.state = job.state
    self.hparams = self.config.pruning if self.config.prune else None
    self.dense_at = self.config.pruning.begin_pruning_step if self.config.prune else None
    self.meta: dict[str, Any] = {'dense_accuracy': None}
    self.checkpointer: checkpoints.Checkpointer | None = None
    self.saved_step: int | None = None  # the newest checkpoint
    self.finite_step = int(self.state.step)  # the newest step known to be finite
    self.shrunk: channels.ChannelResult | None = None
    # A language model's held-out loss is also reported in bits per byte.
    self.text = self.config.data.name == 'text'

  def _then(self) -> str:
    where = (
      f'the newest checkpoint is step {self.saved_step}'
      if self.saved_step is not None
      else 'no checkpoint was written yet'
    )
    return f'{where}; free some space, then run the same command to resume'

  def _writing(self, what: str, path: str) -> Any:
    return files.writing(what, path, self._then())

  def _resume(self) -> None:
    """Checks the workdir's config, restores the newest good checkpoint, records the config."""
    config, workdir = self.config, self.workdir
    self._check_outputs()
    recorded = workdir_lib.read_config(workdir)
    with self._writing('the checkpoint directory', os.path.join(workdir, 'checkpoints')):
      self.checkpointer = checkpoints.Checkpointer(workdir, config.max_checkpoints_to_keep)
    # The checkpoints' config is checksummed: where there is one, it decides.
    restored = self.checkpointer.restore_newest(
      self.state, lambda meta: workdir_lib.check_compatible(meta['config'], config, workdir)
    )
    if restored is None and recorded is not None:
      workdir_lib.check_compatible(recorded, config, workdir)
    if restored is not None:
      self.saved_step, self.state, self.meta = restored
      self._check_records(recorded)
      self.finite_step = self.saved_step
      if self.saved_step >= config.num_steps:
        print(f'The run in {workdir} is complete (step {self.saved_step}); reporting it.')
      else:
        print(f'Resuming from the checkpoint of step {self.saved_step} in {workdir}.')
    # Recorded only now that the run is known to be compatible, and only when
    # it trains: a finished run's record keeps the config it was trained with.
    if int(self.state.step) < config.num_steps and self.writes:
      path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
      with self._writing('the run config', path):
        workdir_lib.record_config(workdir, config)

  def _check_records(self, recorded: dict[str, Any] | None) -> None:
    """Checks config.json and metrics.jsonl against the checkpoint resumed from.

    Raises:
      ConfigError: metrics.jsonl is missing, so the history up to the
        checkpoint would be lost without a word.
    """
    workdir, step = self.workdir, self.saved_step
    path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
    with self._writing('the run config', path):
      workdir_lib.repair_config(workdir, recorded, self.meta['config'], step)
    metrics_path = os.path.join(workdir, METRICS_FILE)
    if step > 0 and not os.path.exists(metrics_path):
      raise ConfigError(
        f'{metrics_path} is missing, but the run resumes from its checkpoint of step {step}: '
        'the history up to that step would be lost. Restore the file from a backup, or '
        f'create an empty one ({os.path.basename(metrics_path)}) to resume without it.'
      )

  def _check_outputs(self) -> None:
    """ConfigError for an output file that is a directory or a dangling link.

    Checked before training, so that a run cannot fail on one after it.
    """
    outputs = {workdir_lib.CONFIG_FILE: 'config', METRICS_FILE: 'metrics', REPORT_FILE: 'report'}
    if self.config.plots:
      outputs.update(
        dict.fromkeys((plots.SPARSITY_PNG, plots.ACCURACY_PNG, plots.LAYERS_PNG), 'plots')
      )
      if self.text:
        outputs[plots.BITS_PNG] = 'plots'
    if self.job.rule is not None:
      outputs[channels.MODEL_FILE] = 'pruned model'
    for name, what in outputs.items():
      files.check_file(os.path.join(self.workdir, name), what)

  def _check_finite(self, step: int, loss: float | None = None) -> None:
    """Raises DivergedError unless the loss and every float of the state are finite."""
    if loss is not None and not math.isfinite(loss):
      what = f'the training loss is {loss}'
    elif not bool(_all_finite(self.state)):
      what = 'the params or the optimizer state hold NaN or Inf values'
    else:
      self.finite_step = step
      return
    saved = (
      f'the newest checkpoint (step {self.saved_step}) is from before'
      if self.saved_step is not None
      else 'no checkpoint was written'
    )
    raise DivergedError(
      f'training diverged: at step {step} {what} (all finite at step {self.finite_step}); '
      f'config.optimizer.learning_rate={self.config.optimizer.learning_rate} is likely too '
      f'high. Nothing non-finite was saved: {saved}. Train again with a lower learning '
      'rate and a new --workdir.'
    )

  def _save(self, state: TrainState) -> None:
    if self.checkpointer is None:
      return
    step = int(state.step)
    if step != self.finite_step:
      self._check_finite(step)
    self.meta['config'] = workdir_lib.config_to_json(self.config)
    meta = dict(self.meta)
    if self.dense_at is not None and step < self.dense_at:
      # Ctrl-C during the checkpoint of `dense_at` saves the step before it,
      # whose resumed run drops the dense record and must measure it again.
      meta['dense_accuracy'] = None
      meta.pop('dense_bits_per_byte', None)
    self.checkpointer.save(step, state, meta)
    self.saved_step = step

  def run(self, on_step: Callable[[int, TrainState], None] | None) -> TrainResult:
    """Resumes, trains up to `num_steps`, then reports."""
    config, job = self.config, self.job
    if self.workdir is not None:
      self._resume()
    # Said once the run is known to go ahead.
    shortfall = validate.schedule_shortfall(config)
    if shortfall is not None:
      warnings.warn(shortfall, stacklevel=3)
    start = int(self.state.step)
    metrics_path = os.path.join(self.workdir or '', METRICS_FILE)
    with self._writing('the metrics', metrics_path):
      writer = MetricsWriter(
        self.workdir if self.writes else None,
        resume_step=start,
        tensorboard=config.tensorboard and self.writes,
      )

    def write(step: int, scalars: dict[str, Any]) -> None:
      with self._writing('the metrics', metrics_path):
        writer.write(step, scalars)

    def measure_dense(step: int) -> None:
      # The accuracy the pruned model is compared with: the dense model at the
      # step where pruning may begin. Measured before that step's checkpoint so
      # that a resumed run has it in `meta`.
      if step == self.dense_at and self.meta['dense_accuracy'] is None:
        dense = job.evaluate(self.state.params, job.dataset.x_test, job.dataset.y_test)
        self.meta['dense_accuracy'] = dense['accuracy']
        record = {'dense_test_accuracy': dense['accuracy']}
        if self.text:
          self.meta['dense_bits_per_byte'] = dense['loss'] / math.log(2)
          record['dense_test_bits_per_byte'] = self.meta['dense_bits_per_byte']
        write(step, record)

    measure_dense(start)
    completed = self.state  # the newest state whose step was fully logged
    bar = progress.progress(
      config.num_steps, start, config.progress_bar and distributed.is_primary()
    )
    ctrl_c = process.DeferredCtrlC.install()
    try:
      for step in range(start, config.num_steps):
        self.state, metrics = job.train_step(self.state, job.feed(step))
        done = step + 1
        last = done == config.num_steps
        if done % config.log_every == 0 or last:
          scalars = {k: float(v) for k, v in metrics.items()}
          self._check_finite(done, scalars['loss'])
          if self.text:
            scalars['bits_per_byte'] = scalars['loss'] / math.log(2)
          scalars.update(stats.pruning_scalars(distributed.host_copy(self.state), self.hparams))
          write(done, scalars)
          bar.set_postfix(
            loss=f'{scalars["loss"]:.3f}',
            acc=f'{scalars["accuracy"]:.3f}',
            sparsity=f'{scalars.get("achieved_sparsity", 0.0):.3f}',
          )
        if done % config.eval_every == 0 or last:
          test = job.evaluate(self.state.params, job.dataset.x_test, job.dataset.y_test)
          record = {'test_loss': test['loss'], 'test_accuracy': test['accuracy']}
          if self.text:
            record['test_bits_per_byte'] = test['loss'] / math.log(2)
          write(done, record)
          if config.progress_bar:
            bar.write(f'step {done}: test accuracy {test["accuracy"]:.4f}')
        measure_dense(done)
        if done % config.checkpoint_every == 0 or last:
          self._save(self.state)
        completed = self.state
        bar.update(1)
        if on_step is not None:
          on_step(done, self.state)
        ctrl_c.check()
      ctrl_c.restore()
      if job.rule is not None:
        self._shrink(write, writer.history)
    except KeyboardInterrupt:
      # Keep the progress made so far, up to the last step whose metrics were
      # all written, so that the resumed history has no gap. (Not with several
      # processes: the others go on training, so this one cannot save with them.)
      if not distributed.multiprocess():
        self._save(completed)
      raise
    finally:
      ctrl_c.uninstall()
      bar.close()
      self._close(writer, metrics_path)
    return self._finish(writer.history)

  def _close(self, writer: MetricsWriter, metrics_path: str) -> None:
    """Closes the writers; a failure is raised only if no error is on its way already.

    On a full disk, closing the files fails again: that second error must not
    replace the one that stopped the run.
    """
    failing = sys.exc_info()[1] is not None
    try:
      with self._writing('the metrics', metrics_path):
        writer.close()
    except Exception:
      if not failing:
        raise
    finally:
      if self.checkpointer is not None:
        try:
          self.checkpointer.close()
        except Exception:
          if not failing:
            raise

  def _shrink(
    self, write: Callable[[int, dict[str, Any]], None], history: list[dict[str, Any]]
  ) -> None:
    """Cuts the pruned channels out, writes pruned_model.bin, records what it gained.

    A rerun of a finished run keeps the record (and the speedup reported) of
    the run that trained it.
    """
    job = self.job
    params, opt_state = distributed.host_copy((self.state.params, self.state.opt_state))
    if not distributed.is_primary():
      return
    path = os.path.join(self.workdir or '', channels.MODEL_FILE)
    with self._writing('the pruned model', path):
      self.shrunk = channels.finish(
        job.rule, job.model, params, opt_state, job.dataset.x_test, job.dataset.y_test, self.workdir
      )
    step = int(self.state.step)
    recorded = [r for r in history if r['step'] == step and 'speedup' in r]
    if recorded:
      self.shrunk = dataclasses.replace(self.shrunk, speedup=recorded[-1]['speedup'])
    else:
      write(step, self.shrunk.scalars())

  def _finish(self, history: list[dict[str, Any]]) -> TrainResult:
    """Evaluates the final state and writes the report and plots."""
    job, state = self.job, self.state
    final = job.evaluate(state.params, job.dataset.x_test, job.dataset.y_test)
    hparams, host = self.hparams, distributed.host_copy(state)
    run_report = report.RunReport(
      # Channel runs report their groups instead (the thresholds are per group).
      leaves=stats.leaf_reports(host, hparams) if job.rule is None else [],
      **stats.param_counts(host.params),
      dense_accuracy=self.meta['dense_accuracy'],
      dense_step=self.dense_at,
      final_accuracy=final['accuracy'],
      final_step=int(state.step),
      global_target=(
        hparams.target_sparsity if hparams is not None and hparams.global_pruning else None
      ),
      channels=tuple(self.shrunk.lines()) if self.shrunk is not None else (),
      bits_per_byte=final['loss'] / math.log(2) if self.text else None,
      dense_bits_per_byte=self.meta.get('dense_bits_per_byte'),
    )
    if self.writes:
      path = os.path.join(self.workdir, REPORT_FILE)
      with self._writing('the report', path):
        files.atomic_write(path, report.format_report(run_report) + '\n')
      if self.config.plots:
        with self._writing('the plots', self.workdir):
          plots.save_plots(self.workdir, history, run_report.leaves)
    return TrainResult(state, run_report, history, self.workdir)
