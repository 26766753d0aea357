"""The order one-shot pruning visits layers in: wave k reads only outputs of waves below k;
`passes` groups the layers by wave, by block (`sequential=<regex>`) or all together.

`_layers.layers_and_reasons` finds the layers and what each reads (its uses' taint);
a layer's wave is its longest path in that graph, which stays linear in the number
of steps for a stack of scanned layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from typing import Any


def waves(found: dict[int, list[Any]], scans: dict[Any, Any]) -> dict[Hashable, int]:
  """The wave of each layer: `(leaf, None)`, or `(leaf, i)` for slice i of a stack.

  A layer's wave is one more than the largest wave of the layers it reads, slice i
  of a stack reads its own step's slices (`('cur', leaf)`) and, through the
  carry, every slice of the steps before it (`('prev', leaf)`): a helper node
  `('before', leaf, i)` stands for those, the largest wave among them, so that
  the graph stays linear in the number of steps.
  """
  stacks = {leaf: uses[0].stack for leaf, uses in found.items()}

  def before(leaf: int, i: int) -> int | None:
    """The slice of `leaf` run just before slice `i`, or None for the first one run."""
    layout = scans[stacks[leaf][0]]
    j = i + 1 if layout.reverse else i - 1
    return j if 0 <= j < layout.length else None

  def reads(node: Hashable) -> Iterable[Hashable]:
    if node[0] == 'before':
      _, leaf, i = node
      j = before(leaf, i)
      return [] if j is None else [(leaf, j), ('before', leaf, j)]
    leaf, i = node
    out = []
    for use in found[leaf]:
      for t in use.taint:
        if t[0] == 'cur':
          out.append((t[1], i))
        elif t[0] == 'prev':
          out.append(('before', t[1], i))
        else:
          out.append(t)
    return [r for r in out if r != node and (r[0] == 'before' or r[0] in found)]

  nodes = [(leaf, None) for leaf, uses in found.items() if uses[0].stack is None]
  nodes += [
    (leaf, i)
    for leaf, uses in found.items()
    if uses[0].stack is not None
    for i in range(scans[uses[0].stack[0]].length)
  ]
  return longest_paths(nodes, reads, lambda node: 0 if node[0] == 'before' else 1)


def longest_paths(
  nodes: Iterable[Hashable],
  reads: Callable[[Hashable], Iterable[Hashable]],
  step: Callable[[Hashable], int],
) -> dict[Hashable, int]:
  """`value(n) = step(n) + max(value(r) for r in reads(n))` (-1 for no reads), by an
  explicit depth-first search (a stack of hundreds of layers is deeper than Python's
  recursion); a read that closes a cycle (a weight used twice along a path) is left out."""
  value: dict[Hashable, int] = {}
  for start in nodes:
    if start in value:
      continue
    stack = [(start, iter(reads(start)))]
    on_path = {start}
    best = {start: -1}
    while stack:
      node, pending = stack[-1]
      for r in pending:
        if r in value:
          best[node] = max(best[node], value[r])
        elif r not in on_path:
          stack.append((r, iter(reads(r))))
          on_path.add(r)
          best[r] = -1
          break
      else:
        stack.pop()
        on_path.discard(node)
        value[node] = best[node] + step(node)
        if stack:
          parent = stack[-1][0]
          best[parent] = max(best[parent], value[node])
  return {node: v for node, v in value.items() if node[0] != 'before'}


def passes(chosen: list[Any], sequential: bool | str) -> list[list[Any]]:
  """The layers in the order they are measured and pruned: each list is measured on the
  model with the lists before it pruned (one list for `sequential=False`, one per wave for
  True, one per block for a regex, ordered by their first wave)."""
  if sequential is False:
    return [chosen]
  if sequential is True:
    return [
      [layer for layer in chosen if layer.wave == w] for w in sorted({x.wave for x in chosen})
    ]
  blocks: dict[str, list[Any]] = {}
  for layer in chosen:
    found = re.search(sequential, layer.name)
    blocks.setdefault(found.group(0) if found else layer.name, []).append(layer)
  return sorted(blocks.values(), key=lambda block: min(layer.wave for layer in block))


def check_sequential(sequential: Any, layers: list[Any]) -> None:
  """A ValueError unless `sequential` is a bool or a valid regex that matches a layer."""
  if isinstance(sequential, bool):
    return
  example = r"e.g. sequential=r'^layers_\d+/'"
  if not isinstance(sequential, str) or not sequential:
    raise ValueError(
      f'sequential={sequential!r}: give True, False or a regex naming blocks, {example}.'
    )
  try:
    regex = re.compile(sequential)
  except re.error as error:
    raise ValueError(f'sequential={sequential!r}: not a valid regex ({error}).') from None
  if not any(regex.search(layer.name) for layer in layers):
    names = ', '.join(repr(layer.name) for layer in layers[:3])
    raise ValueError(
      f'sequential={sequential!r} matches no layer name (they look like {names}); '
      f"give a regex whose first match names a layer's block, {example}."
    )
