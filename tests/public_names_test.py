"""The public line as users meet it: the benchmarks (the scripts users copy) use public names
only, and the docstrings of public names point at no private module."""

import ast
import importlib
import inspect
import pathlib
import re

import pytest

import jaxprune

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / 'benchmarks').glob('*.py'))


def is_private(name: str) -> bool:
  """`_x` is private; a dunder (`__version__`, `__name__`) is not."""
  return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def dotted(node: ast.expr) -> list[str] | None:
  """`a.b.c` as ['a', 'b', 'c']; None for anything that is not a plain name path."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  return [node.id, *reversed(parts)]


def path_into_package(node: ast.AST) -> bool:
  """`os.path.join(..., 'jaxprune', ...)`, `Path(...) / 'jaxprune_train'`: a benchmark that
  reads the package's files (its private modules, loaded by path) rather than importing it."""
  if isinstance(node, ast.Call):
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, 'id', '')
    parts = node.args if func in ('join', 'Path', 'PurePath', 'joinpath') else []
  elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
    parts = [node.left, node.right]
  else:
    parts = []
  return any(
    isinstance(p, ast.Constant)
    and isinstance(p.value, str)
    and (p.value in ROOTS or p.value.startswith(tuple(f'{r}/' for r in ROOTS)))
    for p in parts
  )


ROOTS = ('jaxprune', 'jaxprune_train')  # the library and the main job beside it


def private_uses(source: str, filename: str = '<source>') -> list[str]:
  """Each `line: path` where `source` reaches a private jaxprune module or attribute: by an
  import, by an attribute path from a name bound to jaxprune (`jaxprune._hparams.HParams`,
  `train._loop`), or by `getattr(jaxprune, '_x')`. A name counts as bound to jaxprune when an
  import or a plain assignment anywhere in the file binds it so (scopes are not told apart)."""
  tree = ast.parse(source, filename)
  bound = {}  # local name -> the jaxprune path it stands for
  found = []

  def report(node: ast.AST, path: list[str]) -> None:
    if path[0] in ROOTS and any(is_private(p) for p in path[1:]):
      found.append(f'{node.lineno}: {".".join(path)}')

  def resolve(node: ast.expr) -> list[str] | None:
    parts = dotted(node)
    if parts is None or parts[0] not in bound:
      return None
    return [*bound[parts[0]], *parts[1:]]

  nodes = list(ast.walk(tree))
  inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}  # `a.b` of `a.b.c`
  for node in nodes:  # bindings first, so a use above its import (in a function) counts
    if isinstance(node, ast.Import):
      for alias in node.names:
        path = alias.name.split('.')
        if path[0] in ROOTS:
          bound[alias.asname or path[0]] = path if alias.asname else [path[0]]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      path = node.module.split('.')
      if path[0] in ROOTS:
        for alias in node.names:
          bound[alias.asname or alias.name] = [*path, alias.name]
  for node in nodes:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target, value = node.targets[0], resolve(node.value)
      if isinstance(target, ast.Name) and value is not None:
        bound[target.id] = value
  for node in nodes:
    if isinstance(node, ast.Import):
      for alias in node.names:
        report(node, alias.name.split('.'))
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      for alias in node.names:
        report(node, [*node.module.split('.'), alias.name])
    elif isinstance(node, ast.Attribute) and id(node) not in inner:
      path = resolve(node)
      if path is not None:
        report(node, path)
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id in ('getattr', 'hasattr')
      and len(node.args) >= 2
      and isinstance(node.args[1], ast.Constant)
      and isinstance(node.args[1].value, str)
    ):
      path = resolve(node.args[0])
      if path is not None:
        report(node, [*path, node.args[1].value])
    if path_into_package(node):
      found.append(f'{node.lineno}: a path into a package (its modules read as files)')
  return sorted(set(found), key=lambda f: (int(f.split(':')[0]), f))


def test_benchmarks_use_public_names_only():
  assert len(BENCHMARKS) > 10
  found = [
    f'{path.relative_to(ROOT)}:{use}'
    for path in BENCHMARKS
    for use in private_uses(path.read_text(), str(path))
  ]
  assert found == [], 'benchmarks reach private jaxprune names:\n' + '\n'.join(found)


@pytest.mark.parametrize(
  'source, expected',
  [
    ('from jaxprune_train import _loop as loop', ['1: jaxprune_train._loop']),
    ('from jaxprune_train._step import make_evaluate', ['1: jaxprune_train._step.make_evaluate']),
    ('import jaxprune._thresholds', ['1: jaxprune._thresholds']),
    (
      'import jaxprune\ndef f() -> jaxprune._hparams.HParams: ...',
      ['2: jaxprune._hparams.HParams'],
    ),
    ('import jaxprune.structured as s\ns._core.cost', ['2: jaxprune.structured._core.cost']),
    ('import jaxprune_train as train\nt = train\nt._data.x', ['3: jaxprune_train._data.x']),
    (
      "import jaxprune as jp\ngetattr(jp.structured, '_shared')",
      ['2: jaxprune.structured._shared'],
    ),
    ('def f():\n  return jaxprune._masks\nimport jaxprune', ['2: jaxprune._masks']),
    (
      "import os\nos.path.join(root, 'jaxprune', 'train')",
      ['2: a path into a package (its modules read as files)'],
    ),
    (
      "root / 'jaxprune_train/_models.py'",
      ['1: a path into a package (its modules read as files)'],
    ),
    # Allowed: public names, dunders, the benchmarks' own helpers, other libraries' `_x`.
    ('import jaxprune\njaxprune.structured.trace\njaxprune.__version__', []),
    ('from benchmarks._timing import table\nimport optax\noptax._src', []),
    ('from jaxprune import get_pruning_hparams as g\ng()._replace(x=1)', []),
  ],
)
def test_the_benchmark_check_finds_private_paths(source, expected):
  assert private_uses(source) == expected


# A private path: a dotted name through `jaxprune` (or one of its namespaces) with a part
# that starts with `_` (`jaxprune._masks`, `jaxprune_train._loop`, `structured._shared`), a
# dotted name that starts with a private module (`_core.cost`), or a file path with such a
# part (`_prune/pipeline.py`, `jaxprune/_masks.py`, `_shared.py`).
NAMESPACES = '|'.join(jaxprune._NAMESPACES)
PRIVATE_PATH = re.compile(
  rf'\b(?:jaxprune|jaxprune_train|{NAMESPACES})(?:\.[A-Za-z]\w*)*\._(?!_)\w*'
  r'|(?<![\w.])(?:[\w.]+/)*_(?!_)\w*/[\w./]*\.py\b'
  r'|(?<![\w./])(?:[\w.]+/)*_(?!_)\w*\.py\b'
  r'|(?<![\w./])_(?!_)[a-z]\w*\.[a-z]\w*'
)

PUBLIC_PACKAGES = [
  'jaxprune',
  *(f'jaxprune.{n}' for n in jaxprune._NAMESPACES),
  'jaxprune_train',
]


def documented(package: str):
  """(label, docstring) of the package and of each name in its `__all__` (with the public
  methods and properties of a class, which its page lists too)."""
  module = importlib.import_module(package)
  yield package, module.__doc__ or ''
  for name in module.__all__:
    obj = getattr(module, name)
    if not (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj)):
      continue  # a constant's __doc__ is its type's
    yield f'{package}.{name}', inspect.getdoc(obj) or ''
    if inspect.isclass(obj):
      for attr, member in vars(obj).items():
        if not is_private(attr) and (callable(member) or isinstance(member, property)):
          yield f'{package}.{name}.{attr}', inspect.getdoc(member) or ''


@pytest.mark.parametrize('package', PUBLIC_PACKAGES)
def test_public_docstrings_point_at_no_private_path(package):
  found = {
    f'{label}: {match.group(0)}'
    for label, doc in documented(package)
    for match in PRIVATE_PATH.finditer(doc)
  }
  assert sorted(found) == [], 'public docstrings name private paths:\n' + '\n'.join(found)


@pytest.mark.parametrize(
  'text, expected',
  [
    ('see jaxprune._masks.update', ['jaxprune._masks']),
    ('(`jaxprune_train._loop`)', ['jaxprune_train._loop']),
    ('in structured._shared', ['structured._shared']),
    ('as _prune/pipeline.py does', ['_prune/pipeline.py']),
    ('jaxprune/structured/_prune/pipeline.py', ['jaxprune/structured/_prune/pipeline.py']),
    ('jaxprune/_masks.py', ['jaxprune/_masks.py']),
    ('see _shared.py and _core.cost', ['_shared.py', '_core.cost']),
    ('jaxprune.structured.trace, jaxprune.__version__, state._replace(x=1)', []),
    ('benchmarks/width.py and __init__.py', []),
  ],
)
def test_the_docstring_check_finds_private_paths(text, expected):
  assert [m.group(0) for m in PRIVATE_PATH.finditer(text)] == expected


@pytest.mark.parametrize(
  'module, typed, meant',
  [
    ('jaxprune', 'pruneing', 'pruning'),
    ('jaxprune', 'sparce', 'sparse'),
    ('jaxprune.sparse', 'set', 'set_'),
    ('jaxprune.sparse', 'rig', 'rigl'),
    ('jaxprune.oneshot', 'prune_with_reports', 'prune_with_report'),
    ('jaxprune.structured', 'prun', 'prune'),
    ('jaxprune.channels', 'ChanelRule', 'ChannelRule'),
    ('jaxprune.functional', 'l1_unstructure', 'l1_unstructured'),
    ('jaxprune.methods', 'validate', 'validate_amount'),
    ('jaxprune_train', 'trian', 'train'),
  ],
)
def test_a_misspelt_public_name_suggests_the_nearest(module, typed, meant):
  namespace = importlib.import_module(module)
  with pytest.raises(
    AttributeError, match=rf'has no attribute {typed!r}; did you mean {module}\.{meant}\?$'
  ):
    getattr(namespace, typed)


def test_a_name_near_nothing_public_suggests_nothing():
  with pytest.raises(AttributeError, match=r"^module 'jaxprune.sparse' has no attribute 'zzzz'$"):
    jaxprune.sparse.zzzz  # noqa: B018
  assert not hasattr(jaxprune.sparse, '__wrapped__')  # tools' probes stay AttributeErrors
