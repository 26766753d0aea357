"""Tests of the `jaxprune-train` command line (run as subprocesses)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), 'jaxprune-train')
# A short schedule: dense until step 20, pruned to the target by step 100.
SHORT = ['--config.num_steps=120', '--config.eval_every=60', '--config.checkpoint_every=60',
         '--config.progress_bar=False', '--config.pruning.begin_pruning_step=20',
         '--config.pruning.sparsity_function_begin_step=20',
         '--config.pruning.end_pruning_step=100', '--config.pruning.sparsity_function_end_step=100',
         '--config.pruning.pruning_frequency=10']


def _run(args, cwd=REPO):
  return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def _report_rows(workdir):
  with open(os.path.join(workdir, 'report.txt')) as f:
    rows = [line.split() for line in f if line.startswith('Dense_')]
  return {row[0]: int(row[3].replace(',', '')) for row in rows}


def _config_json(workdir):
  with open(os.path.join(workdir, 'config.json')) as f:
    return json.load(f)


def test_config_file_and_field_overrides(tmp_path):
  workdir = str(tmp_path / 'digits')
  result = _run([SCRIPT, '--config', 'configs/digits_mlp.py', '--workdir', workdir, *SHORT,
                 '--config.pruning.target_sparsity=0.95',
                 "--config.pruning.weight_sparsity_map=['Dense_0/kernel:0.5']"])
  assert result.returncode == 0, result.stderr
  pruning = _config_json(workdir)['pruning']
  assert pruning['target_sparsity'] == 0.95
  assert pruning['weight_sparsity_map'] == ['Dense_0/kernel:0.5']
  # The default's exact threshold keeps round(N * (1 - s)) weights:
  # 19,200 * 0.5, 30,000 * 0.05 and 1,000 * 0.05.
  assert _report_rows(workdir) == {'Dense_0/kernel': 9600, 'Dense_1/kernel': 1500,
                                   'Dense_2/kernel': 50}
  assert f'Outputs in {workdir}' in result.stdout
  assert 'test accuracy: dense at start of pruning (step 20)' in result.stdout
  # The same workdir with another seed is refused, naming the field.
  result = _run([SCRIPT, '--workdir', workdir, *SHORT, '--config.seed=3'])
  assert result.returncode == 1
  assert 'config.seed: 0 in the saved run, 3 now' in result.stderr
  assert 'Pick a new --workdir' in result.stderr


def test_tf_hparams_string_goes_on_top_of_the_config(tmp_path):
  workdir = str(tmp_path / 'tf')
  result = _run([sys.executable, '-m', 'jaxprune.train', '--workdir', workdir, *SHORT,
                 '--config.pruning.target_sparsity=0.5',
                 '--pruning_hparams=target_sparsity=0.9,weight_sparsity_map=[Dense_1:0.95]'])
  assert result.returncode == 0, result.stderr
  pruning = _config_json(workdir)['pruning']
  assert pruning['target_sparsity'] == 0.9
  assert pruning['weight_sparsity_map'] == ['Dense_1:0.95']
  assert _report_rows(workdir) == {'Dense_0/kernel': 1920, 'Dense_1/kernel': 1500,
                                   'Dense_2/kernel': 100}


def test_help_lists_the_flags():
  result = _run([SCRIPT, '--help'])
  # absl's --help exits with status 1 after printing the flags.
  for flag in ('--config:', '--workdir:', '--pruning_hparams:'):
    assert flag in result.stdout


def test_bad_values_are_clear_errors(tmp_path):
  result = _run([SCRIPT, '--workdir', str(tmp_path / 'bad'),
                 '--config.pruning.target_sparsity=1.5'])
  assert result.returncode != 0
  assert 'target_sparsity=1.5' in result.stderr
  result = _run([SCRIPT, '--workdir', str(tmp_path / 'bad'),
                 '--pruning_hparams=target_sparsity=0.9,no_such_field=1'])
  assert result.returncode != 0
  assert "unknown hyperparameter 'no_such_field'" in result.stderr


@pytest.mark.slow
def test_default_run_with_no_flags_meets_the_goal(tmp_path):
  """The README's command: >= 90% sparsity, within 2 points of the dense model."""
  result = _run([SCRIPT], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr
  workdir = tmp_path / 'runs' / 'digits_mlp'
  assert _report_rows(str(workdir)) == {'Dense_0/kernel': 1920, 'Dense_1/kernel': 3000,
                                        'Dense_2/kernel': 100}
  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  [dense] = [r['dense_test_accuracy'] for r in records if 'dense_test_accuracy' in r]
  final = records[-1]['test_accuracy']
  assert records[-1]['step'] == 3000
  assert final >= dense - 0.02
  for name in ('sparsity.png', 'accuracy.png', 'layer_sparsity.png', 'report.txt'):
    assert (workdir / name).exists()
  assert 'Outputs in' in result.stdout and 'runs/digits_mlp' in result.stdout
