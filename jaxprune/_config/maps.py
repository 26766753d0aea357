"""The hyperparameters as text: TF's HParams string and the per-variable maps.

See docs/explanation/semantics.md#hyperparameters.

A string is comma-separated `name=value` pairs, list values in brackets. A
map is a list of 'regex:value' entries: the value is the text after the LAST
':' (TF split on every ':'; we allow ':' inside a regex); empty entries are
dropped; every regex must compile.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxprune import _warnings as warnings_lib
from jaxprune._checks import check_fraction
from jaxprune._numerics import INT32_MAX


def split_top_level(text: str) -> list[str]:
  """Splits 'a=1,b=[x,y],c=2' on the commas that are outside brackets."""
  parts, depth, current = [], 0, []
  for char in text:
    if char == '[':
      depth += 1
    elif char == ']':
      depth -= 1
      if depth < 0:
        raise ValueError(f'parse_hparams: unbalanced "]" in {text!r}.')
    if char == ',' and depth == 0:
      parts.append(''.join(current))
      current = []
    else:
      current.append(char)
  if depth != 0:
    raise ValueError(f'parse_hparams: unbalanced "[" in {text!r}.')
  parts.append(''.join(current))
  return [p.strip() for p in parts if p.strip()]


def convert(name: str, raw: str, default: Any) -> Any:
  """Converts the text of one value to the type of the field's default."""
  if isinstance(default, (list, tuple)):
    if not (raw.startswith('[') and raw.endswith(']')):
      raise ValueError(
        f'parse_hparams: {name}={raw!r} must be a bracketed list, e.g. {name}=[regex:value].'
      )
    return [item.strip() for item in raw[1:-1].split(',') if item.strip()] or ['']
  if isinstance(default, bool):
    lowered = raw.lower()
    if lowered not in ('true', 'false', '1', '0'):
      raise ValueError(f'parse_hparams: {name}={raw!r} must be true or false.')
    return lowered in ('true', '1')
  if isinstance(default, int):
    try:
      return int(raw)
    except ValueError:
      raise ValueError(f'parse_hparams: {name}={raw!r} must be an integer.') from None
  if isinstance(default, float):
    try:
      return float(raw)
    except ValueError:
      raise ValueError(f'parse_hparams: {name}={raw!r} must be a number.') from None
  return raw


def _entries(field: str, values: Any) -> list[tuple[str, str]]:
  """Splits the non-empty entries of a map at their LAST ':' into (regex, value)."""
  entries = []
  for entry in values:
    if not entry:
      continue
    if ':' not in entry:
      raise ValueError(f'{field} entry {entry!r}: expected "regex:value".')
    regex, value = entry.rsplit(':', 1)
    check_regex(f'{field} entry {entry!r}', regex)
    _check_not_empty(field, entry, regex, value.strip())
    entries.append((regex, value.strip()))
  return entries


def match_entries(
  field: str, names: Sequence[str], entries: Iterable[tuple[str, Any]], *, kind: str = 'leaf'
) -> tuple[dict[str, Any], list[str]]:
  """Each name's value from the one map entry whose regex it matches: jaxprune's map rule.

  Every per-name map follows it: the hparams' maps (`weight_sparsity_map`,
  `block_dims_map`, `nm_sparsity_map`, `layer_axes_map`), `jaxprune.sparse`'s
  `sparsity_map` and `oneshot.prune`'s `overrides`. Regexes are matched with
  `re.search` against the names (docs/explanation/semantics.md#names-and-maps).

  Args:
    field: the map's name, for the error.
    names: the names the map applies to (the pruned leaves, the layers).
    entries: (regex, value) pairs.
    kind: what a name names, for the error ('leaf', 'layer').

  Returns:
    ({name: value} for the names an entry matches, [the regexes that match no name]).
    The caller reports the regexes with `warn_unmatched`.

  Raises:
    ValueError: when a name matches several entries, naming it and them: which value
      it should get is ambiguous.
  """
  entries = list(entries)
  values: dict[str, Any] = {}
  used: set[str] = set()
  for name in names:
    hits = [(regex, value) for regex, value in entries if re.search(regex, name)]
    if len(hits) > 1:
      raise ValueError(
        f'{field}: {kind} {name!r} matches several entries {[regex for regex, _ in hits]}; '
        'make the regexes exclusive.'
      )
    if hits:
      used.add(hits[0][0])
      values[name] = hits[0][1]
  return values, [regex for regex, _ in entries if regex not in used]


def warn_unmatched(unmatched: Sequence[str], names: Sequence[str], what: str) -> None:
  """Warns, naming them and the names, about map entries that match nothing.

  A warning rather than an error (docs/explanation/semantics.md#names-and-maps): an entry
  is a pattern over the names of a model, and a config may be shared by models that do
  not all have every layer; the warning still names a regex with a typo at once.

  Args:
    unmatched: the entries, as the user should read them ("sparsity_map entry 'x'").
    names: the names they were matched against.
    what: what one name is, plural, e.g. 'pruned leaves'.
  """
  if unmatched:
    verb = 'matches' if len(unmatched) == 1 else 'match'
    warnings_lib.warn(
      f'jaxprune: {", ".join(unmatched)} {verb} none of the {what}, which are '
      f'{list(names)}. Fix the regexes (matched with re.search) or drop them.'
    )


# What to write instead of a map entry for every leaf: the field that sets all of them.
_FOR_EVERY_LEAF = {
  'weight_sparsity_map': 'target_sparsity={}'.format,
  'block_dims_map': lambda dims: 'block_height={},block_width={}'.format(
    *(dims.lower().split('x') + ['W'])[:2]
  ),
  'nm_sparsity_map': "nm_sparsity='{}'".format,
}


def _check_not_empty(field: str, entry: str, regex: str, value: str) -> None:
  """ValueError for an entry whose regex is empty: it matches every leaf, which is almost
  always a name left out, and what a plain field says more plainly."""
  if regex.strip():
    return
  every = _FOR_EVERY_LEAF.get(field, "'.*:{}'".format)(value)
  raise ValueError(
    f'{field} entry {entry!r}: the regex before the value is empty, which matches every '
    f"leaf; name the leaves (e.g. 'conv1:{value}'), or for every leaf write {every}."
  )


def check_regex(where: str, regex: str) -> None:
  """ValueError naming `where` when `regex` does not compile."""
  try:
    re.compile(regex)
  except re.error as err:
    raise ValueError(f'{where}: invalid regex {regex!r} ({err}).') from None


def sparsity_map(hparams: Any) -> list[tuple[str, float]]:
  """Returns `weight_sparsity_map` as [(regex, sparsity)], validated."""
  parsed = []
  for regex, value in _entries('weight_sparsity_map', field(hparams, 'weight_sparsity_map')):
    try:
      sparsity = float(value)
    except ValueError:
      raise ValueError(
        f'weight_sparsity_map entry {regex}:{value}: sparsity {value!r} is not a number.'
      ) from None
    check_fraction('sparsity', sparsity, where=f'weight_sparsity_map entry {regex}:{value}')
    parsed.append((regex, sparsity))
  return parsed


def _block_dim(field: str, entry: str, text: str) -> int:
  try:
    dim = int(text)
  except ValueError:
    raise ValueError(f'{field} entry {entry!r}: block dim {text!r} is not an integer.') from None
  if not (1 <= dim <= INT32_MAX or dim == -1):
    raise ValueError(
      f'{field} entry {entry!r}: block dims must be in [1, 2**31 - 1] or -1 '
      f'(the whole dimension), got {dim}.'
    )
  return dim


def block_dims_map(hparams: Any) -> list[tuple[str, tuple[int, int]]]:
  """Returns `block_dims_map` as [(regex, (height, width))], validated."""
  parsed = []
  for regex, value in _entries('block_dims_map', field(hparams, 'block_dims_map')):
    entry = f'{regex}:{value}'
    dims = value.lower().split('x')
    if len(dims) != 2:
      raise ValueError(f'block_dims_map entry {entry!r}: block dims must be HxW, e.g. 4x4.')
    parsed.append((regex, tuple(_block_dim('block_dims_map', entry, d) for d in dims)))
  return parsed


def nm_map(hparams: Any) -> list[tuple[str, tuple[int, int]]]:
  """Returns `nm_sparsity_map` as [(regex, (n, m))]; entries read 'regex:N:M'."""
  parsed = []
  for entry in field(hparams, 'nm_sparsity_map'):
    if not entry:
      continue
    pieces = entry.rsplit(':', 2)
    if len(pieces) != 3:
      raise ValueError(
        f'nm_sparsity_map entry {entry!r}: expected "regex:N:M", e.g. "Dense_0:2:4" '
        '(keep 2 of every 4).'
      )
    check_regex(f'nm_sparsity_map entry {entry!r}', pieces[0])
    _check_not_empty('nm_sparsity_map', entry, pieces[0], f'{pieces[1]}:{pieces[2]}'.strip())
    try:
      parsed.append((pieces[0], parse_nm(f'{pieces[1]}:{pieces[2]}')))
    except ValueError as err:
      raise ValueError(f'nm_sparsity_map entry {entry!r}: {err}') from None
  return parsed


def layer_axes_map(hparams: Any) -> list[tuple[str, int | tuple[int, ...]]]:
  """Returns `layer_axes_map` as [(regex, leading count or axis indices)].

  An entry 'regex:K' says that the first K axes of the matching leaves index
  layers (a leaf stacked by `nn.scan` or `nn.vmap`); 'regex:@A' names the layer
  axis by its index A, anywhere in the leaf (MaxText's `param_scan_axis=1` gives
  (embed, layers, mlp) kernels: '@1'), and '@A@B' names several (negative
  indices count from the end). Each layer gets its own threshold, target and
  blocks, as if it were a separate variable.
  """
  parsed: list[tuple[str, int | tuple[int, ...]]] = []
  for regex, value in _entries('layer_axes_map', field(hparams, 'layer_axes_map')):
    if value.startswith('@'):
      parsed.append((regex, _axis_indices(regex, value)))
      continue
    try:
      axes = int(value)
    except ValueError:
      axes = 0
    if axes < 1 or str(axes) != value:
      raise ValueError(
        f'layer_axes_map entry {regex}:{value}: the number of leading layer '
        f'axes must be an integer >= 1, e.g. "{regex}:1", or the layer axis by its '
        f'index, e.g. "{regex}:@1".'
      )
    parsed.append((regex, axes))
  return parsed


def _axis_indices(regex: str, value: str) -> tuple[int, ...]:
  """The axis indices of an '@A@B' value, each an integer written plainly, none twice."""
  texts = value[1:].split('@')
  indices = []
  for text in texts:
    try:
      index = int(text)
    except ValueError:
      index = None
    if index is None or str(index) != text:
      raise ValueError(
        f'layer_axes_map entry {regex}:{value}: each layer axis after "@" must be an '
        f'integer axis index, e.g. "{regex}:@1" (axis 1) or "{regex}:@0@2" (axes 0 and 2).'
      )
    indices.append(index)
  if len(set(indices)) != len(indices):
    raise ValueError(
      f'layer_axes_map entry {regex}:{value}: axis {_repeated(indices)} is named twice; '
      'name each layer axis once.'
    )
  return tuple(indices)


def _repeated(indices: list[int]) -> int:
  return next(i for i in indices if indices.count(i) > 1)


def field(hparams: Any, name: str) -> Any:
  """A field of a mapping (dict, ConfigDict) or of an object (`HParams`)."""
  return hparams[name] if isinstance(hparams, Mapping) else getattr(hparams, name)


def parse_nm(spec: str | tuple[int, int] | None) -> tuple[int, int] | None:
  """Parses and validates an N:M pattern such as `'2:4'`.

  Args:
    spec: `'N:M'` (spaces allowed), a tuple `(n, m)`, or `''`/`None` for "no
      N:M pattern".

  Returns:
    `(n, m)` with `1 <= n < m`, or `None` for an empty spec.

  Raises:
    ValueError: if the text is not two integers separated by `:` or the
      numbers are out of range.
  """
  if spec is None or (isinstance(spec, str) and not spec.strip()):
    return None
  if isinstance(spec, str):
    parts = spec.split(':')
    try:
      if len(parts) != 2:
        raise ValueError
      n, m = (int(p.strip()) for p in parts)
    except ValueError:
      raise ValueError(f"N:M pattern {spec!r}: expected two integers 'N:M' such as '2:4'") from None
  else:
    try:
      n, m = spec
    except (TypeError, ValueError):
      raise ValueError(f'N:M pattern {spec!r}: expected a pair (n, m) such as (2, 4)') from None
    if (
      isinstance(n, bool) or isinstance(m, bool) or not (isinstance(n, int) and isinstance(m, int))
    ):
      raise ValueError(f'N:M pattern {spec!r}: n and m must be integers, e.g. (2, 4)')
  if not 1 <= n < m:
    raise ValueError(f'N:M pattern {spec!r}: need 1 <= N < M (keep N of every M weights), e.g. 2:4')
  return n, m
