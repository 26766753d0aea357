"""The names around the pruning fields: the ConfigDict that records which fields the user
assigned, and the names other libraries use for them (answered in errors with ours)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ml_collections

# tfmot's `sparsity_m_by_n=(m, n)` zeroes m of every n; ours keeps N of every M.
RENAMED = {
  'sparsity_m_by_n': (
    "sparsity_m_by_n is tfmot's name, where (m, n) means m ZEROS in every n weights; "
    "jaxprune's field is nm_sparsity='N:M', which KEEPS N of every M: tfmot's (m, n) is "
    "nm_sparsity='<n-m>:<n>' (2:4 for (2, 4), 3:4 for (1, 4))"
  ),
}


# Other libraries' names for our fields (tfmot, torch.nn.utils.prune, jaxpruner): spelling
# alone would point elsewhere (difflib takes `sparsity` for `nm_sparsity`).
ALIASES = {
  'sparsity': 'target_sparsity',
  'amount': 'target_sparsity',
  'target': 'target_sparsity',
  'final_sparsity': 'target_sparsity',
  'end_step': 'sparsity_function_end_step',
  'begin_step': 'sparsity_function_begin_step',
  'start_step': 'sparsity_function_begin_step',
  'update_freq': 'pruning_frequency',
  'power': 'sparsity_function_exponent',
  'exponent': 'sparsity_function_exponent',
  'sparsity_map': 'weight_sparsity_map',
  'regex': 'weight_name_regex',
}


class PruningConfig(ml_collections.ConfigDict):
  """A ConfigDict of pruning fields that records which fields were assigned (`given_fields`).

  `get_pruning_hparams` and `parse_hparams` return one, so that a field the user
  sets counts as set even at its default's value (`target_sparsity = 0.5` beside
  `nm_sparsity` is refused like any other target). Assignments by attribute, by
  item, by `update` and by ml_collections' command-line overrides all go through
  `__setitem__`; a deep copy or pickle keeps the record, a plain
  `ml_collections.ConfigDict(config)` does not (every field it holds counts as given).
  """

  def __init__(
    self,
    initial_dictionary: Any = None,
    *args: Any,
    given: Iterable[str] = (),
    **kwargs: Any,
  ) -> None:
    """Args: as ConfigDict's, and `given`, the fields that count as set from the start."""
    # ConfigDict's own __setattr__ makes fields; the record is a plain attribute.
    object.__setattr__(self, '_given', set())
    super().__init__(initial_dictionary, *args, **kwargs)
    self._given.clear()
    self._given.update(given)

  def assigned(self) -> frozenset[str]:
    """The fields assigned so far (and those given at construction)."""
    return frozenset(self._given)

  def reset_assigned(self, given: Iterable[str]) -> None:
    """Counts exactly `given` as assigned (after copying another config's values in)."""
    self._given.clear()
    self._given.update(given)

  def __setitem__(self, key: str, value: Any) -> None:
    super().__setitem__(key, value)
    self._given.add(key)

  def __setstate__(self, state: dict[str, Any]) -> None:
    # ConfigDict rebuilds a copy or an unpickled config by assigning every field.
    super().__setstate__(state)
    object.__setattr__(self, '_given', set(state.get('_given', ())))

  def copy_and_resolve_references(self, visit_map: Any = None) -> PruningConfig:
    copy = super().copy_and_resolve_references(visit_map)
    object.__setattr__(copy, '_given', set(self._given))
    return copy
