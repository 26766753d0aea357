"""The settings' one list: each field, its type, default and description.

TensorFlow `model_pruning`'s fields and defaults first (Zhu & Gupta 2017, arXiv:1710.01878),
then jaxprune's. `Fields` holds them as given; `HParams` (`jaxprune._config.hparams`) adds
the checks and the parsed maps. The schedule, the rules between fields and the advice read
`Fields`, so they need nothing of `HParams`.
"""

from __future__ import annotations

import dataclasses

# Which leaves are pruned by default: Dense/Conv kernels and embeddings
# (docs/explanation/semantics.md#names-and-maps).
DEFAULT_WEIGHT_NAME_REGEX = '(kernel|embedding)$'
_NO_ENTRIES = ('',)


# What each field does: the one description, read by `HParams`' docstring (the API page)
# and by the main job's --help. TF model_pruning's fields first, then jaxprune's.
FIELD_DOCS = {
  'name': 'prefix of the summary names',
  'begin_pruning_step': 'first step at which the masks may change',
  'end_pruning_step': 'last step at which the masks may change; -1 never stops',
  'weight_sparsity_map': 'per-leaf targets, e.g. "[\'Dense_0/kernel:0.5\']"',
  'block_dims_map': 'per-leaf block shapes, e.g. "[\'Dense_0:4x4\']" (-1 = whole axis)',
  'threshold_decay': 'exponential smoothing of the thresholds between updates, in [0, 1)',
  'pruning_frequency': 'steps between two mask updates, at least 1',
  'nbins': "histogram bins of threshold_method='histogram'",
  'block_height': 'height of the blocks pruned together (-1 = whole axis)',
  'block_width': 'width of the blocks pruned together (-1 = whole axis)',
  'block_pooling_function': "'AVG' or 'MAX': how a block's magnitudes are pooled",
  'initial_sparsity': 'sparsity at sparsity_function_begin_step, in [0, 1)',
  'target_sparsity': 'sparsity at and after sparsity_function_end_step, in [0, 1)',
  'sparsity_function_begin_step': 'step where the sparsity schedule starts',
  'sparsity_function_end_step': 'step where the schedule reaches target_sparsity',
  'sparsity_function_exponent': 'shape of the schedule: 1 linear, 3 (Zhu & Gupta) prunes '
  'fast early and slowly late',
  'use_tpu': "accepted for TF's configs; changes nothing",
  'threshold_method': "'histogram' (TF's binned CDF) or 'exact' (the k-th magnitude)",
  'weight_name_regex': 'leaves pruned: those whose name (e.g. Dense_0/kernel) matches',
  'global_pruning': 'one threshold over all pruned leaves instead of one per leaf',
  'nm_sparsity': "keep N of every M weights along the input axis, e.g. '2:4'",
  'nm_sparsity_map': 'per-leaf N:M patterns, e.g. "[\'Dense_2/kernel:2:4\']"',
  'layer_axes_map': 'axes that index stacked layers: K leading ones, e.g. "[\'scan/kernel:1\']", '
  'or by index, e.g. "[\'decoder/.*kernel:@1\']" for (embed, layers, mlp)',
  'mask_source': "'updated' (TF's order: the weights after this step) or 'params' (before)",
  'mask_search': "how thresholds are searched (same result): 'fixed' (GPUs, TPUs), "
  "'adaptive' (CPUs) or 'auto' (by backend)",
}


@dataclasses.dataclass(frozen=True)
class Fields:
  """The settings as given, with their defaults (`FIELD_DOCS` says what each does)."""

  name: str = 'model_pruning'
  begin_pruning_step: int = 0
  end_pruning_step: int = -1
  weight_sparsity_map: tuple[str, ...] = _NO_ENTRIES
  block_dims_map: tuple[str, ...] = _NO_ENTRIES
  threshold_decay: float = 0.0
  pruning_frequency: int = 10
  nbins: int = 256
  block_height: int = 1
  block_width: int = 1
  block_pooling_function: str = 'AVG'
  initial_sparsity: float = 0.0
  target_sparsity: float = 0.5
  sparsity_function_begin_step: int = 0
  sparsity_function_end_step: int = 100
  sparsity_function_exponent: float = 3.0
  use_tpu: bool = False
  # jaxprune additions.
  threshold_method: str = 'histogram'
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX
  global_pruning: bool = False
  nm_sparsity: str = ''
  nm_sparsity_map: tuple[str, ...] = _NO_ENTRIES
  layer_axes_map: tuple[str, ...] = _NO_ENTRIES
  mask_source: str = 'updated'
  mask_search: str = 'auto'
