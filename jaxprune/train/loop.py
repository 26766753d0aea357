"""The training loop: data, model, jitted step, evaluation, checkpoints, outputs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import ml_collections
import tqdm

from jaxprune.train import checkpoints, data, models, plots, report, sharding, stats
from jaxprune.train.metrics import MetricsWriter
from jaxprune.train.step import (
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


def _validate(config: ml_collections.ConfigDict) -> None:
  for field in ('num_steps', 'batch_size', 'log_every', 'eval_every', 'checkpoint_every'):
    if config[field] < 1:
      raise ValueError(f'{field}={config[field]!r}: must be a positive integer.')


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          on_step: Callable[[int, TrainState], None] | None = None) -> TrainResult:
  """Trains (and prunes) the model of `config`, resuming from `workdir`.

  Args:
    config: a training config (see `jaxprune/train/defaults.py`).
    workdir: directory for checkpoints, `metrics.jsonl`, TensorBoard events,
      the report and plots. If it holds a checkpoint of the same config, the
      run resumes from its newest checkpoint. None writes nothing.
    on_step: called as `on_step(step, state)` after each train step.

  Returns:
    A `TrainResult`.

  Raises:
    ValueError: if `workdir` holds a run with an incompatible config.
  """
  _validate(config)
  dataset = data.load_dataset(config.data.name, config.data.path,
                              config.data.seed, config.data.test_fraction)
  model = models.create_model(config.model, dataset.num_classes)
  tx = make_optimizer(config)
  params = models.init_params(model, dataset.x_train.shape[1:], config.seed)
  state = create_train_state(params, tx)
  # The one place the step is jitted: everything it needs is in its arguments.
  mesh = sharding.make_mesh(config.get('mesh_shape', ()))
  # Placed first, so that a checkpoint is restored straight into these shards.
  state = sharding.place(state, mesh)
  train_step = sharding.jit_train_step(make_train_step(model.apply, tx), mesh, state,
                                       config.batch_size)
  evaluate = make_evaluate(model.apply)
  hparams = config.pruning if config.prune else None
  dense_at = config.pruning.begin_pruning_step if config.prune else None

  meta: dict[str, Any] = {'dense_accuracy': None}
  checkpointer = None
  if workdir is not None:
    checkpoints.check_workdir_config(workdir, config)
    checkpointer = checkpoints.Checkpointer(workdir, config.max_checkpoints_to_keep)
    latest = checkpointer.latest_step()
    if latest is not None:
      # Compared before the state is read: a changed model would otherwise
      # fail inside orbax with a shape error instead of naming the field.
      checkpoints.check_compatible(checkpointer.restore_meta(latest)['config'],
                                   config, workdir)
      state, meta = checkpointer.restore(latest, state)
      if latest >= config.num_steps:
        print(f'The run in {workdir} is complete (step {latest}); reporting it.')
      else:
        print(f'Resuming from the checkpoint of step {latest} in {workdir}.')
  start = int(state.step)
  writer = MetricsWriter(workdir, resume_step=start,
                         tensorboard=config.tensorboard and workdir is not None)

  def save(saved: TrainState) -> None:
    if checkpointer is not None:
      meta['config'] = checkpoints.config_to_json(config)
      checkpointer.save(int(saved.step), saved, meta)

  def measure_dense(step: int) -> None:
    # The accuracy the pruned model is compared with: the dense model at the
    # step where pruning may begin. Measured before that step's checkpoint so
    # that a resumed run has it in `meta`.
    if step == dense_at and meta['dense_accuracy'] is None:
      meta['dense_accuracy'] = evaluate(state.params, dataset.x_test,
                                        dataset.y_test)['accuracy']
      writer.write(step, {'dense_test_accuracy': meta['dense_accuracy']})

  measure_dense(start)
  completed = state  # the newest state whose step was fully logged
  bar = tqdm.tqdm(total=config.num_steps, initial=start, unit='step',
                  disable=not config.progress_bar or start >= config.num_steps,
                  dynamic_ncols=True)
  try:
    for step in range(start, config.num_steps):
      batch = data.get_batch(dataset, config.seed, step, config.batch_size)
      state, metrics = train_step(state, batch)
      done = step + 1
      last = done == config.num_steps
      if done % config.log_every == 0 or last:
        scalars = {k: float(v) for k, v in metrics.items()}
        scalars.update(stats.pruning_scalars(state, hparams))
        writer.write(done, scalars)
        bar.set_postfix(loss=f'{scalars["loss"]:.3f}', acc=f'{scalars["accuracy"]:.3f}',
                        sparsity=f'{scalars.get("achieved_sparsity", 0.0):.3f}')
      if done % config.eval_every == 0 or last:
        test = evaluate(state.params, dataset.x_test, dataset.y_test)
        writer.write(done, {'test_loss': test['loss'], 'test_accuracy': test['accuracy']})
        if config.progress_bar:
          bar.write(f'step {done}: test accuracy {test["accuracy"]:.4f}')
      measure_dense(done)
      if done % config.checkpoint_every == 0 or last:
        save(state)
      completed = state
      bar.update(1)
      if on_step is not None:
        on_step(done, state)
  except KeyboardInterrupt:
    # Keep the progress made so far, up to the last step whose metrics were
    # all written, so that the resumed history has no gap.
    save(completed)
    raise
  finally:
    bar.close()
    writer.close()
    if checkpointer is not None:
      checkpointer.close()

  final = evaluate(state.params, dataset.x_test, dataset.y_test)
  run_report = report.RunReport(
      leaves=stats.leaf_reports(state, hparams),
      **stats.param_counts(state.params),
      dense_accuracy=meta['dense_accuracy'], dense_step=dense_at,
      final_accuracy=final['accuracy'], final_step=int(state.step))
  if workdir is not None:
    with open(os.path.join(workdir, REPORT_FILE), 'w') as f:
      f.write(report.format_report(run_report) + '\n')
    if config.plots:
      plots.save_plots(workdir, writer.history, run_report.leaves)
  return TrainResult(state, run_report, writer.history, workdir)
