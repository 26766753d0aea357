"""The goals of benchmarks/cost.py as data, and the markdown report that renders them.

The run's results are the dicts that cost.py's `headline`, `matrix`, `steps`, `full_step` and
`plans` return. The `*_rows` functions and `pruning_state` work out each table's numbers from
them, `goals` judges every goal on every case, and `report` only writes both out.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jaxprune

try:
  from benchmarks._timing import table
except ImportError:  # run as a script from the benchmarks folder
  from _timing import table

if TYPE_CHECKING:
  from benchmarks.cost import Sizes

FORMS = ('pruned', 'chained')
PLANS = ('fixed', 'adaptive')
# `pruned` thresholding the params the step starts from (`mask_source='params'`), not the
# weights after it (TF's order, the default): the search then needs no stored updates.
PARAMS_SOURCE = 'pruned, mask_source=params'
# The optimizer step's rows: both forms x both plans, and the params source on the plan of
# GPUs and TPUs.
HEADLINE = tuple((form, plan) for form in FORMS for plan in PLANS) + ((PARAMS_SOURCE, 'fixed'),)
RULES = {
  'histogram': '',
  'exact': 'threshold_method=exact',
  'blocked': 'block_dims_map=[mlp:4x4]',
  'global': 'global_pruning=true',
  # The vocabulary (50257) is not divisible by 4: N:M on every kernel, magnitude on embeddings.
  'N:M 2:4': 'nm_sparsity_map=[kernel:2:4]',
}
NEVER = 'begin_pruning_step=1000000000'
EVERY = 'pruning_frequency=1'
GOAL_TEMP, GOAL_STEP, GOAL_COMPILE, GOAL_FULL, GOAL_PLAN = 0.1, 1.03, 3.0, 1.2, 1.10
HLO_OPS = ('fusion', 'copy', 'conditional', 'while')
COMPILE_REPEATS = 2  # the optimizer step's compile time is the least of this many
UPDATE_STEPS = ('pruned, update', 'chained, update', 'sort-based, update')


@dataclasses.dataclass(frozen=True)
class Goal:
  """One goal judged on one case.

  Attributes:
    name: the goal, led by its number in cost.py's docstring ('1 temp <= 0.1x params').
    case: what it was measured on (form and plan, rule, model).
    measured: the value judged against `limit` (the worst of `values` where they are several,
      the last layer count's compile ratio over the first's for the growth goal); None for a
      case no goal judges.
    limit: the bound on `measured`; None for a case no goal judges.
    at_least: met when `measured >= limit`, not `<=`.
    verdict: 'met', 'met (why)', 'not met (by how much)' or 'info'.
    values: the numbers the summary shows, each with its label (a layer count, a step).
    cell: how the summary writes one of `values` (a format string of `label` and `value`).
    joiner: what joins the written values.
  """

  name: str
  case: str
  measured: float | None
  limit: float | None
  at_least: bool
  verdict: str
  values: tuple[tuple[str, float], ...]
  cell: str = '{value:.2f}x'
  joiner: str = ', '


@dataclasses.dataclass(frozen=True)
class OptimizerRow:
  """One row of the optimizer-step table: one value per layer count (`Sizes.layers`).

  Attributes:
    name: 'Adam', or the form and plan ('pruned, fixed').
    temp: XLA temp bytes beyond Adam's (Adam's row: its own), over the params' bytes.
    seconds: CPU seconds to lower and compile the step.
    vs_adam: `seconds` over Adam's.
    kernels: fused kernels of the compiled step.
  """

  name: str
  temp: tuple[float, ...]
  seconds: tuple[float, ...]
  vs_adam: tuple[float, ...]
  kernels: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PruningState:
  """The pruning state beyond Adam's at one layer count, alike for every form and plan.

  Attributes:
    layers: the layer count.
    masks: bytes of the masks (bool: one byte per pruned weight).
    other: bytes of the thresholds and counters.
    per_pruned_weight: state bytes per pruned weight.
    per_param: state bytes per float32 param.
  """

  layers: int
  masks: int
  other: int
  per_pruned_weight: float
  per_param: float


@dataclasses.dataclass(frozen=True)
class StepTime:
  """One step of the loop users write, timed on one model.

  Attributes:
    model: the model's name.
    name: 'Adam', a form ('pruned': no mask update) or a form with ', update'.
    seconds: seconds per step.
    vs_adam: `seconds` over Adam's.
    counts: HLO_OPS counts of the compiled step (None for the update steps).
  """

  model: str
  name: str
  seconds: float
  vs_adam: float
  counts: dict[str, int] | None


@dataclasses.dataclass(frozen=True)
class FullStep:
  """A full GPT-2 training step with one optimizer.

  Attributes:
    form: 'Adam' or a form.
    plan: the search plan ('auto' for Adam).
    seconds: CPU seconds to lower and compile.
    vs_adam: `seconds` over Adam's.
    temp: XLA temp bytes.
    beyond: temp bytes beyond Adam's, over the params' bytes.
  """

  form: str
  plan: str
  seconds: float
  vs_adam: float
  temp: int
  beyond: float


@dataclasses.dataclass(frozen=True)
class PlanTime:
  """`jaxprune.update_mask` with each search plan, for one threshold rule.

  Attributes:
    rule: 'histogram' or 'exact'.
    fixed: seconds with the fixed plan.
    adaptive: seconds with the adaptive plan.
    speedup: `fixed` over `adaptive`.
  """

  rule: str
  fixed: float
  adaptive: float
  speedup: float


def verdict(value: float, goal: float, at_least: bool = False) -> str:
  """'met', or 'not met (by how much)'."""
  if (value >= goal) if at_least else (value <= goal):
    return 'met'
  return f'not met (by {abs(value - goal):.2f}x)'


# ---------------------------------------------------------------------------- the tables' numbers


def optimizer_rows(sizes: Sizes, head: dict) -> list[OptimizerRow]:
  """Adam's row, then one per HEADLINE form and plan, from `headline`'s results."""
  rows = []
  for key in ('Adam', *HEADLINE):
    temp, seconds, vs_adam, kernels = [], [], [], []
    for n in sizes.layers:
      adam_seconds, adam_temp, _ = head[n]['Adam']
      once, bytes_, fused = head[n][key]
      beyond = bytes_ if key == 'Adam' else bytes_ - adam_temp
      temp.append(beyond / head[n]['nbytes'])
      seconds.append(once)
      vs_adam.append(once / adam_seconds)
      kernels.append(fused)
    name = key if key == 'Adam' else ', '.join(key)
    rows.append(OptimizerRow(name, tuple(temp), tuple(seconds), tuple(vs_adam), tuple(kernels)))
  return rows


def pruning_state(sizes: Sizes, head: dict) -> PruningState:
  """The state beyond Adam's at the first layer count, from `headline`'s results."""
  n = sizes.layers[0]
  masks, other = head[n]['state']
  total = masks + other
  return PruningState(n, masks, other, total / max(masks, 1), total / (head[n]['nbytes'] / 4))


def step_rows(steps: dict) -> list[StepTime]:
  """Every timed step of every model, from `steps`' results."""
  rows = []
  for model, r in steps.items():
    adam = r['per_step']['Adam']
    for name, seconds in r['per_step'].items():
      rows.append(StepTime(model, name, seconds, seconds / adam, r['counts'].get(name)))
  return rows


def full_rows(full: dict) -> list[FullStep]:
  """Adam's full step, then each pruning one, from `full_step`'s results."""
  adam_seconds, adam_temp = full['rows']['Adam', 'auto']
  return [
    FullStep(form, plan, seconds, seconds / adam_seconds, temp, (temp - adam_temp) / full['nbytes'])
    for (form, plan), (seconds, temp) in full['rows'].items()
  ]


def plan_rows(plans: dict) -> list[PlanTime]:
  """Each threshold rule's time with either plan, from `plans`' results."""
  rows = []
  for rule in ('histogram', 'exact'):
    fixed, adaptive = plans[rule, 'fixed'], plans[rule, 'adaptive']
    rows.append(PlanTime(rule, fixed, adaptive, fixed / adaptive))
  return rows


# ---------------------------------------------------------------------------- the goals


def _judged(name, case, measured, limit, values, cell='{value:.2f}x', at_least=False) -> Goal:
  return Goal(
    name, case, measured, limit, at_least, verdict(measured, limit, at_least), values, cell
  )


def _optimizer_goals(sizes: Sizes, rows: list[OptimizerRow]) -> list[Goal]:
  found = []
  labels = [str(n) for n in sizes.layers]
  for row in rows:
    if row.name == 'Adam':
      continue
    temps = tuple(zip(labels, row.temp, strict=True))
    ratios = tuple(zip(labels, row.vs_adam, strict=True))
    at = '{value:.2f}x at {label}'
    found.append(
      _judged(
        '1 temp <= 0.1x params', f'{row.name}, histogram', max(row.temp), GOAL_TEMP, temps, at
      )
    )
    found.append(
      _judged(
        '3 optimizer-step compile <= 3x', row.name, max(row.vs_adam), GOAL_COMPILE, ratios, at
      )
    )
    if len(ratios) > 1:
      growth = row.vs_adam[-1] / row.vs_adam[0]
      found.append(
        Goal(
          f'3 compile ratio not growing {labels[0]} -> {labels[-1]}',
          row.name,
          growth,
          1.0,
          False,
          'met' if growth <= 1 else f'not met (grew {100 * (growth - 1):.0f}%)',
          (ratios[0], ratios[-1]),
          joiner=' -> ',
        )
      )
  return found


def _matrix_goals(sizes: Sizes, mat: dict) -> list[Goal]:
  found = []
  for rule in sizes.matrix_rules:
    values = {(form, plan): mat[rule, form, plan] for form in FORMS for plan in PLANS}
    worst = max(values, key=values.get)
    found.append(
      _judged(
        '1 temp <= 0.1x params',
        f'{rule}, all forms and plans, {sizes.matrix_layers} layers',
        values[worst],
        GOAL_TEMP,
        ((', '.join(worst), values[worst]),),
        'worst {value:.2f}x ({label})',
      )
    )
  return found


def _step_goals(rows: list[StepTime]) -> list[Goal]:
  found = []
  by_model: dict[str, dict[str, StepTime]] = {}
  for row in rows:
    by_model.setdefault(row.model, {})[row.name] = row
  for model, times in by_model.items():
    for form in FORMS:
      ratio = times[form].vs_adam
      found.append(
        _judged(
          '2 non-update step <= 1.03x',
          f'{form}, {model}',
          ratio,
          GOAL_STEP,
          (('', ratio),),
          '{value:.3f}x',
        )
      )
    updates = tuple((name.split(',')[0], times[name].vs_adam) for name in UPDATE_STEPS)
    found.append(
      Goal(
        '2 update step (no goal: cost beside a sort)',
        model,
        None,
        None,
        False,
        'info',
        updates,
        '{label} {value:.2f}x',
      )
    )
  return found


def _full_goals(rows: list[FullStep]) -> list[Goal]:
  found = []
  for row in rows:
    if row.form == 'Adam':
      continue
    case = f'{row.form}, {row.plan}'
    found.append(
      _judged('3 full-step compile <= 1.2x', case, row.vs_adam, GOAL_FULL, (('', row.vs_adam),))
    )
    found.append(
      _judged(
        '1 temp <= 0.1x params', f'{case}, full step', row.beyond, GOAL_TEMP, (('', row.beyond),)
      )
    )
  return found


def _plan_goals(rows: list[PlanTime]) -> list[Goal]:
  found = []
  for row in rows:
    if row.speedup >= GOAL_PLAN:
      mark = 'met (adaptive earns its place on the CPU)'
    else:
      mark = f'not met (adaptive {100 * (row.speedup - 1):+.0f}%, < +10%: one plan would do)'
    found.append(
      Goal(
        '4 second plan kept only if >= 10% faster where chosen',
        f"{row.rule}: adaptive (the CPU's plan) vs fixed, CPU",
        row.speedup,
        GOAL_PLAN,
        True,
        mark,
        (('', row.speedup),),
        '{value:.2f}x as fast',
      )
    )
  return found


def goals(sizes: Sizes, results: dict) -> list[Goal]:
  """Every goal on every case the results measured.

  Args:
    sizes: the run's sizes.
    results: cost.py's results, by part ('headline', 'matrix', 'steps', 'full', 'plans');
      parts not run are left out.

  Returns:
    The goals by their number; those of one number in the order the parts measured them.
  """
  found = []
  if results.get('headline'):
    found += _optimizer_goals(sizes, optimizer_rows(sizes, results['headline']))
  if results.get('matrix'):
    found += _matrix_goals(sizes, results['matrix'])
  if results.get('steps'):
    found += _step_goals(step_rows(results['steps']))
  if results.get('full'):
    found += _full_goals(full_rows(results['full']))
  if results.get('plans'):
    found += _plan_goals(plan_rows(results['plans']))
  return sorted(found, key=lambda goal: goal.name[0])


# ---------------------------------------------------------------------------- markdown


def summary_row(goal: Goal) -> list[str]:
  """The summary table's cells of one goal: name, case, the measured values, verdict."""
  measured = goal.joiner.join(goal.cell.format(label=k, value=v) for k, v in goal.values)
  return [goal.name, goal.case, measured, goal.verdict]


def _optimizer_section(sizes: Sizes, head: dict) -> str:
  header = ['form, plan'] + [f'{n} layers: temp beyond Adam' for n in sizes.layers]
  header += [f'{n} layers: compile s (vs Adam)' for n in sizes.layers]
  rows = []
  for row in optimizer_rows(sizes, head):
    compiles = zip(row.seconds, row.vs_adam, row.kernels, strict=True)
    if row.name == 'Adam':
      cells = [f'{t:.2f}x (itself)' for t in row.temp]
      cells += [f'{s:.1f} ({k:,} kernels)' for s, _, k in compiles]
    else:
      cells = [f'{t:.2f}x' for t in row.temp]
      cells += [f'{s:.1f} ({r:.2f}x, {k:,} kernels)' for s, r, k in compiles]
    rows.append([row.name, *cells])
  leaves = ', '.join(f'{head[n]["leaves"]} leaves at {n}' for n in sizes.layers)
  state = pruning_state(sizes, head)
  return (
    f'### 1, 3. The optimizer step alone (GPT-2-small-shaped float32 tree, width '
    f'{sizes.width}, vocab {sizes.vocab}; {leaves}; histogram rule)\n\n'
    "Temp: XLA temp bytes of the donated step beyond plain Adam's, as a multiple of the "
    "params' bytes (goal <= 0.1x). Compile: CPU seconds to lower and compile, the least "
    f'of {COMPILE_REPEATS} compiles (they move by 10-30% between runs on a shared '
    "machine), and the compiled step's fused kernels, which compile time follows.\n"
    '\n' + table(header, rows) + '\n'
    f"\nPruning state beyond Adam's ({state.layers} layers, every form and plan alike): masks "
    f'{state.masks / 2**20:.1f} MiB (bool, 1 byte per pruned weight, {state.masks / 1e6:.1f}M '
    f'pruned weights), thresholds and counters {state.other} bytes; '
    f'{state.per_pruned_weight:.3f} bytes per pruned weight, '
    f'{state.per_param:.3f} per param (Adam: 8).\n'
  )


def _matrix_section(sizes: Sizes, mat: dict) -> str:
  header = ['rule'] + [f'{form}, {plan}' for form in FORMS for plan in PLANS]
  rows = [
    [rule] + [f'{mat[rule, form, plan]:.2f}x' for form in FORMS for plan in PLANS]
    for rule in sizes.matrix_rules
  ]
  return (
    f"### 1. Temp beyond Adam's, every rule (reduced size: {sizes.matrix_layers} layers, "
    f"width {sizes.width}, vocab {sizes.matrix_vocab}; x the params' bytes)\n\n"
    + table(header, rows)
    + '\n\nRules: '
    + '; '.join(
      f'{k}: `{RULES[k]}`' if RULES[k] else f'{k}: the defaults' for k in sizes.matrix_rules
    )
    + '. The histogram rule (the defaults) is in the headline rows above.\n'
  )


def _steps_section(sizes: Sizes, steps: dict) -> str:
  header = ['model', 'step', 'ms / step', 'vs Adam'] + [f'HLO {op}' for op in HLO_OPS]
  rows = [
    [row.model, row.name, f'{row.seconds * 1e3:.2f}', f'{row.vs_adam:.3f}x']
    + ([str(row.counts[op]) for op in HLO_OPS] if row.counts else [''] * len(HLO_OPS))
    for row in step_rows(steps)
  ]
  return (
    '### 2. The loop users write: one jitted donated call per step (grad, update, '
    'apply_updates)\n\n'
    f'Non-update rows: masks never updated (`{NEVER}`), {sizes.steps_per_call} consecutive '
    f'steps per timed call; update rows: a mask update at every step (`{EVERY}`), one '
    f'step per call; interleaved, median of {sizes.rounds}. Default search plan '
    f"('{jaxprune.get_pruning_hparams().mask_search}': adaptive on the CPU). HLO counts of "
    'the compiled non-update step.\n\n' + table(header, rows) + '\n'
  )


def _full_section(sizes: Sizes, full: dict) -> str:
  rows = [
    [
      f'{row.form}, {row.plan}',
      f'{row.seconds:.1f}',
      f'{row.vs_adam:.2f}x',
      f'{row.temp / 2**20:.0f}',
      f'{row.beyond:.2f}x',
    ]
    for row in full_rows(full)
  ]
  return (
    f"### 3. A full GPT-2 training step: transformers' FlaxGPT2LMHeadModel "
    f'({sizes.full_layers} layers, width {sizes.full_width}, {full["params"] / 1e6:.0f}M '
    f'params, shapes only), batch 1x{sizes.full_length}, donated\n\n'
    "Temp beyond Adam's: as a multiple of the params' bytes. In this step XLA runs Adam's "
    "update of each layer as soon as the backward pass has its gradients, so Adam's own "
    "temp holds a few layers' gradients, not all of them.\n\n"
    + table(['step', 'compile CPU s', 'vs Adam', 'temp MiB', 'temp beyond Adam'], rows)
    + '\n'
  )


def _plans_section(sizes: Sizes, plans: dict) -> str:
  rows = [
    [row.rule, f'{row.fixed * 1e3:.1f}', f'{row.adaptive * 1e3:.1f}', f'{row.speedup:.2f}x']
    for row in plan_rows(plans)
  ]
  side = sizes.mask_side
  return (
    f'### 4. The search plans: jaxprune.update_mask on a {side}x{side} float32 array, '
    f'sparsity 0.9, interleaved (median of {sizes.mask_rounds})\n\n'
    + table(['rule', 'fixed ms', 'adaptive ms', 'adaptive speed-up'], rows)
    + '\n'
  )


def report(sizes: Sizes, results: dict) -> str:
  """The tables of the parts the results hold, and the summary of every goal.

  Args:
    sizes: the run's sizes.
    results: cost.py's results, by part (see `goals`).

  Returns:
    Markdown: a section per part, then the summary table (`summary_row` of each of `goals`).
  """
  sections = {
    'headline': _optimizer_section,
    'matrix': _matrix_section,
    'steps': _steps_section,
    'full': _full_section,
    'plans': _plans_section,
  }
  lines = [render(sizes, results[part]) for part, render in sections.items() if results.get(part)]
  lines.append(
    '### Summary: each goal, measured on this run\n\n'
    + table(
      ['goal', 'case', 'measured', 'verdict'], [summary_row(g) for g in goals(sizes, results)]
    )
  )
  return '\n'.join(lines)
