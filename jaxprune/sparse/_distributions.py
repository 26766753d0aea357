"""Which leaves are sparse and how dense each one is: uniform, ERK and per-leaf maps.

The Erdos-Renyi-Kernel distribution is that of Evci et al. 2020 ("Rigging the
Lottery", arXiv:1911.11134, section 3; Mocanu et al. 2018 for Erdos-Renyi):
the density of a leaf is `eps * sum(shape) / prod(shape)`, with one `eps` for
all leaves chosen so that the kept count over all of them is `(1 - S)` of
their size. A leaf whose density would exceed 1 is made dense and `eps` is
solved again over the rest, as in RigL's and jaxpruner's code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from jaxprune._checks import check_fraction
from jaxprune._config import maps as maps
from jaxprune._config import specs as specs
from jaxprune._config.fields import DEFAULT_WEIGHT_NAME_REGEX
from jaxprune._config.specs import PruneFilter
from jaxprune._names import named_leaves

PyTree = Any
DISTRIBUTIONS = ('uniform', 'erk')


def sparse_names(
  params: PyTree,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: PruneFilter | None = None,
) -> list[str]:
  """Names of the leaves that get a mask, in the params' flattening order.

  By default those whose name matches `weight_name_regex` and that have at
  least 2 dimensions and some elements (jaxprune.pruning's rule, `specs.leaf_filter`);
  `prune_filter(name, leaf)` replaces the regex and the dimensions rule. A chosen leaf
  that is not real floating point is a ValueError naming it.
  """
  chosen = specs.leaf_filter(weight_name_regex if prune_filter is None else prune_filter)
  names = []
  for name, leaf in named_leaves(params):
    if chosen(name, leaf):
      specs.check_prunable(name, leaf)  # an int leaf: an error naming it, not numpy's
      names.append(name)
  return names


def erk_densities(
  shapes: Mapping[str, tuple[int, ...]], sparsity: float, power: float = 1.0
) -> dict[str, float]:
  """ERK densities (Evci et al. 2020) of leaves with these shapes, for global `sparsity`.

  Args:
    shapes: leaf name -> shape.
    sparsity: the fraction of zeros over all these leaves together, in [0, 1).
    power: the exponent of `sum(shape) / prod(shape)` (RigL's `erk_power_scale`).

  Returns:
    name -> density in (0, 1]; leaves that would exceed 1 are exactly 1.
  """
  sizes = {name: math.prod(shape) for name, shape in shapes.items()}
  raw = {name: (sum(shape) / sizes[name]) ** power for name, shape in shapes.items()}
  dense: set[str] = set()
  while True:
    sparse = [name for name in shapes if name not in dense]
    if not sparse:
      return dict.fromkeys(shapes, 1.0)
    # Kept entries left for the sparse leaves once the dense ones take all theirs.
    budget = (1.0 - sparsity) * sum(sizes.values()) - sum(sizes[n] for n in dense)
    eps = budget / sum(raw[n] * sizes[n] for n in sparse)
    largest = max(raw[n] for n in sparse)
    if eps * largest <= 1.0:
      return {name: 1.0 if name in dense else eps * raw[name] for name in shapes}
    dense.update(n for n in sparse if raw[n] == largest)


def densities(
  params: PyTree,
  sparsity: float,
  distribution: str = 'uniform',
  *,
  sparsity_map: Mapping[str, float] | None = None,
  weight_name_regex: str = DEFAULT_WEIGHT_NAME_REGEX,
  prune_filter: PruneFilter | None = None,
  erk_power: float = 1.0,
) -> dict[str, float]:
  """The density (kept fraction) of every sparse leaf.

  Args:
    params: the params (arrays or shape structs).
    sparsity: the target fraction of zeros, in [0, 1).
    distribution: 'uniform' (every leaf at `sparsity`) or 'erk' (`erk_densities`
      over the leaves not in `sparsity_map`).
    sparsity_map: `{regex: sparsity}`; a leaf whose name matches an entry gets
      that sparsity and is left out of the distribution. jaxprune's map rule
      (`jaxprune.pruning`'s): a leaf matching two entries is an error, an entry
      matching no sparse leaf a warning.
    weight_name_regex, prune_filter: which leaves are sparse (`sparse_names`).
    erk_power: the ERK exponent.

  Returns:
    name -> density in (0, 1], for the sparse leaves only.
  """
  spread = Spread(sparsity, distribution, sparsity_map, weight_name_regex, prune_filter, erk_power)
  return spread.densities(params, warn=True)


@dataclasses.dataclass(frozen=True)
class Spread:
  """Which leaves are sparse and how the sparsity spreads over them: the arguments of
  `densities` that `static`, `set_`, `rigl` and `ste` take too, held as one value.

  Each field is the argument of `densities` of the same name, in the same order. Building
  one checks nothing; `Spread.densities` checks every field, where the params are known.
  """

  sparsity: float
  distribution: str
  sparsity_map: Mapping[str, float] | None
  weight_name_regex: str
  prune_filter: PruneFilter | None
  erk_power: float

  def names(self, params: PyTree) -> list[str]:
    """`sparse_names` of `params`: the leaves that get a mask."""
    return sparse_names(params, self.weight_name_regex, self.prune_filter)

  def densities(self, params: PyTree, *, warn: bool) -> dict[str, float]:
    """`densities` of `params`; `warn=False` keeps quiet about unmatched map entries (the
    training rules work them out again at every trace of their update, and warn once, at
    init)."""
    sparsity, distribution, erk_power = self.sparsity, self.distribution, self.erk_power
    check_fraction('sparsity', sparsity, example='0.9')
    if distribution not in DISTRIBUTIONS:
      raise ValueError(f'distribution={distribution!r}: use one of {DISTRIBUTIONS}.')
    if not (isinstance(erk_power, (int, float)) and math.isfinite(erk_power) and erk_power >= 0):
      raise ValueError(
        f'erk_power={erk_power!r}: must be a finite number >= 0 (1 is the '
        "ERK paper's; 0 gives every leaf the same density)."
      )
    entries = dict(self.sparsity_map or {})
    for regex, value in entries.items():
      maps.check_regex(f'sparsity_map entry {regex!r}', regex)
      check_fraction('sparsity', value, where=f'sparsity_map entry {regex!r}')
    shapes = {name: tuple(leaf.shape) for name, leaf in named_leaves(params)}
    names = self.names(params)
    if not names:
      raise ValueError(
        f'no leaf is sparse: none matches weight_name_regex={self.weight_name_regex!r} '
        'with 2 or more dimensions; pass another regex or a prune_filter.'
      )
    mapped, unmatched = maps.match_entries('sparsity_map', names, entries.items())
    if warn:
      maps.warn_unmatched(
        [f'sparsity_map entry {regex!r}' for regex in unmatched], names, 'sparse leaves'
      )
    rest = [name for name in names if name not in mapped]
    if distribution == 'erk':
      shared = erk_densities({n: shapes[n] for n in rest}, sparsity, erk_power) if rest else {}
    else:
      shared = dict.fromkeys(rest, 1.0 - sparsity)
    return {name: 1.0 - mapped[name] if name in mapped else shared[name] for name in names}


def kept_count(size: int, density: float) -> int:
  """Entries kept in a leaf of `size` at `density`, on the host: round(size * density),
  clamped to [1, size].

  The rounding: Python's `round`, half to even, of the float64 product `size * density`
  (itself rounded to float64 first). It is not the kept count of `jaxprune.pruning`'s
  exact rule (a float32 sparsity, rounded in exact arithmetic inside jit;
  docs/explanation/semantics.md#exact-thresholds), which STE's magnitude masks use; the
  two can differ by one at a half-way product.
  """
  return min(size, max(1, round(size * density)))
