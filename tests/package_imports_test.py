"""The public line of the package: what `import jaxprune` loads, what each `__init__` exports,
and which way the imports between the packages go."""

import ast
import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'jaxprune'
PACKAGES = sorted(p.parent for p in PACKAGE.rglob('__init__.py'))
# The public namespaces (jaxprune.structured, ...) and the core: the top-level modules and
# the core's private packages, grouped by idea (jaxprune._config, jaxprune._search, ...).
SUBPACKAGES = sorted(p.name for p in PACKAGES if p.parent == PACKAGE and not p.name.startswith('_'))
CORE_PACKAGES = sorted(p.name for p in PACKAGES if p.parent == PACKAGE and p.name.startswith('_'))
CORE = sorted(p for p in PACKAGE.glob('*.py') if p.name != '__init__.py') + sorted(
  p for name in CORE_PACKAGES for p in (PACKAGE / name).glob('*.py')
)
JOB = ROOT / 'jaxprune_train'  # the main job: a package beside the library, not in it

# Heavy dependencies, and jaxprune's own packages, that `import jaxprune` must not load.
NOT_LOADED = [
  'flax',
  'scipy',
  'orbax',
  'transformers',
  'sklearn',
  'jaxprune_train',
  *(f'jaxprune.{p}' for p in SUBPACKAGES),
]

IMPORT_SCRIPT = """
import json, sys
import jaxprune
loaded = sorted(sys.modules)
trace = jaxprune.structured.trace
from jaxprune import channels
print(json.dumps({'loaded': loaded, 'dir': dir(jaxprune), 'trace': trace.__module__,
                  'channels': channels.ChannelRule.__module__,
                  'after': 'jaxprune.structured' in sys.modules}))
"""


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imported_modules(source: str, name: str, is_package: bool) -> set[str]:
  """Every module an `import` anywhere in `source` (functions and `if` blocks included)
  may load, as absolute names; `from a import b` counts both `a` and `a.b`."""
  package = name if is_package else name.rpartition('.')[0]
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
        base = '.'.join(anchor + ([base] if base else []))
      found.add(base)
      found.update(f'{base}.{alias.name}' for alias in node.names)
  return found


def within(module: str, packages: list[str]) -> bool:
  return any(module == p or module.startswith(p + '.') for p in packages)


def violations(paths: list[pathlib.Path], forbidden: list[str]) -> list[str]:
  out = []
  for path in paths:
    name = module_name(path)
    for module in sorted(imported_modules(path.read_text(), name, path.name == '__init__.py')):
      if within(module, forbidden):
        out.append(f'{path.relative_to(ROOT)} imports {module}')
  return out


@pytest.mark.slow
def test_import_jaxprune_loads_only_the_core():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
  result = subprocess.run(
    [sys.executable, '-c', IMPORT_SCRIPT],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
    check=True,
  )
  report = json.loads(result.stdout.splitlines()[-1])
  loaded = [m for m in report['loaded'] if within(m, NOT_LOADED)]
  assert {'jaxprune.structured', 'jaxprune.channels', 'jaxprune_train'} <= set(NOT_LOADED)
  assert loaded == []
  assert {'structured', 'channels', 'sparse', 'functional', 'methods'} <= set(report['dir'])
  assert report['trace'] == 'jaxprune.structured._trace.tracing'
  assert report['channels'] == 'jaxprune.channels._rule'
  assert report['after']


def test_the_library_never_imports_the_job():
  files = sorted(PACKAGE.rglob('*.py'))
  assert len(files) > 50
  assert violations(files, ['jaxprune_train']) == []


def test_jaxprune_train_names_the_jobs_package():
  import jaxprune

  with pytest.raises(AttributeError, match=r'`import jaxprune_train`'):
    jaxprune.train  # noqa: B018


def test_the_jobs_entry_needs_only_the_standard_library():
  """`python -m jaxprune_train` imports the package, then `__main__` imports `_entry`,
  which puts the job's Ctrl-C answer in place: nothing before it may import JAX."""
  script = (
    'import sys\n'
    'import jaxprune_train, jaxprune_train._entry\n'
    'print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxprune", "numpy")))\n'
  )
  out = subprocess.run(
    [sys.executable, '-c', script], capture_output=True, text=True, check=True, timeout=120
  ).stdout
  assert out.strip() == '[]'


def test_unknown_attribute_is_an_attribute_error():
  import jaxprune

  with pytest.raises(AttributeError, match="'jaxprune' has no attribute 'strcutured'"):
    jaxprune.strcutured  # noqa: B018
  assert not hasattr(jaxprune, 'strcutured')


def test_every_subpackage_is_a_namespace_of_jaxprune():
  import jaxprune

  assert set(SUBPACKAGES) <= set(jaxprune._NAMESPACES)
  for name in jaxprune._NAMESPACES:
    assert getattr(jaxprune, name) is importlib.import_module(f'jaxprune.{name}')


# Each namespace's `__getattr__ = suggesting_getattr(__name__, __all__)` comes from here.
ATTRIBUTES = 'jaxprune._attributes'


def is_docstring_all_or_getattr(node: ast.stmt) -> bool:
  """A namespace's own statements: its docstring, `__all__` and the suggesting `__getattr__`."""
  if isinstance(node, ast.Expr):
    return isinstance(node.value, ast.Constant)
  return isinstance(node, ast.Assign) and [getattr(t, 'id', None) for t in node.targets] in (
    ['__all__'],
    ['__getattr__'],
  )


@pytest.mark.parametrize(
  'package',
  [
    *(module_name(p / '__init__.py') for p in PACKAGES if p.name not in CORE_PACKAGES),
    'jaxprune_train',
  ],
)
def test_init_exports_exactly_its_all(package):
  """Each `__init__` holds a docstring, imports and `__all__`; the names it imports from
  jaxprune are `__all__`, and every one resolves."""
  path = ROOT.joinpath(*package.split('.'), '__init__.py')
  tree = ast.parse(path.read_text())
  imported = set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.module == ATTRIBUTES:
      continue  # the `__getattr__` that suggests the nearest public name
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('jaxprune'):
      imported.update(alias.asname or alias.name for alias in node.names)
    elif package not in LAZY:  # those also hold a lazy `__getattr__`
      assert is_docstring_all_or_getattr(node), f'{package}/__init__.py line {node.lineno}'
  module = importlib.import_module(package)
  assert len(module.__all__) == len(set(module.__all__))
  if package == 'jaxprune_train':
    # Lazy: its imports are for type checkers only, and `_MODULES` names where each is.
    imported = {
      alias.asname or alias.name
      for node in ast.walk(tree)
      if isinstance(node, ast.ImportFrom)
      for alias in node.names
      if (node.module or '').startswith('jaxprune_train._')
    }
    assert set(module._MODULES) == imported
  assert set(module.__all__) == imported
  for name in module.__all__:
    assert getattr(module, name) is not None


# Packages whose `__init__` loads what it exports on first use (PEP 562 `__getattr__`).
LAZY = ('jaxprune', 'jaxprune_train')


@pytest.mark.slow
def test_the_main_job_loads_its_modules_on_first_use():
  """A config file's `from jaxprune_train import get_config`, and the command's flag errors,
  load no Flax, orbax or matplotlib (a fresh process: this one has them all)."""
  code = (
    'import sys\n'
    'from jaxprune_train import get_config\n'
    'assert get_config().name == "digits_mlp"\n'
    'heavy = ("flax", "orbax", "matplotlib", "sklearn", "jaxprune.structured")\n'
    'print(sorted(m for m in sys.modules if m.startswith(heavy)))\n'
  )
  out = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=True, timeout=120
  ).stdout
  assert out.strip() == '[]'
  # A mistyped field: one line, and (-X importtime lists every module imported) none of them.
  err = subprocess.run(
    [sys.executable, '-X', 'importtime', '-m', 'jaxprune_train', '--config.num_step=5'],
    capture_output=True,
    text=True,
    timeout=120,
  ).stderr.splitlines()
  assert err[-1].startswith('jaxprune-train: --config.num_step=5: the config has no field')
  loaded = {line.split('|')[-1].strip() for line in err if line.startswith('import time:')}
  assert 'jaxprune_train._usage' in loaded
  assert not {m for m in loaded if m.split('.')[0] in ('flax', 'orbax', 'matplotlib', 'sklearn')}


def test_core_imports_no_package():
  """The core (jaxprune/*.py and its private packages) is what every public package builds
  on: it imports none of them."""
  assert len(CORE) > 30
  assert violations(CORE, [f'jaxprune.{p}' for p in SUBPACKAGES]) == []


# The core's packages, bottom first (docs/explanation/architecture.md): what the user asks
# for, how a threshold is found, weights to masks, the optax transform, what users read back.
# The shared helpers (jaxprune/_names.py, ...) import none of them; the top-level modules
# that implement a public namespace (`_functional`) may import any.
CORE_LAYERS = ('_config', '_search', '_masks', '_transform', '_results')
SHARED = ('_attributes', '_checks', '_meshes', '_names', '_numerics', '_warnings')


def test_every_core_package_has_a_layer():
  assert set(CORE_PACKAGES) == set(CORE_LAYERS)
  top = {p.stem for p in PACKAGE.glob('_*.py') if p.name != '__init__.py'}
  assert set(SHARED) <= top


@pytest.mark.parametrize('layer', CORE_LAYERS)
def test_core_packages_import_only_the_layers_below(layer):
  """No arrow runs back up: the config imports no search or mask code, the search no masks,
  the masks not the transform, and nothing below reads the results."""
  above = CORE_LAYERS[CORE_LAYERS.index(layer) + 1 :]
  files = sorted((PACKAGE / layer).glob('*.py'))
  assert files
  tops = [f'jaxprune.{p.stem}' for p in PACKAGE.glob('_*.py') if p.stem not in SHARED]
  assert violations(files, [*(f'jaxprune.{a}' for a in above), *tops]) == []


def test_shared_helpers_import_no_core_package():
  files = [PACKAGE / f'{name}.py' for name in SHARED]
  assert violations(files, [f'jaxprune.{p}' for p in CORE_LAYERS]) == []


def test_the_core_has_no_import_circle():
  """No module reaches itself through imports, those for type checkers included."""
  graph = {}
  for path in CORE:
    name = module_name(path)
    found = imported_modules(path.read_text(), name, path.name == '__init__.py')
    graph[name] = {m for m in found if m in {module_name(p) for p in CORE} and m != name}
  circles = []

  def visit(name, trail):
    for nxt in sorted(graph[name]):
      if nxt in trail:
        circles.append(' -> '.join([*trail[trail.index(nxt) :], nxt]))
      elif nxt not in done:
        visit(nxt, [*trail, nxt])
    done.add(name)

  done = set()
  for name in sorted(graph):
    if name not in done:
      visit(name, [name])
  assert circles == []


def test_structured_imports_neither_channels_nor_train():
  files = sorted((PACKAGE / 'structured').rglob('*.py'))
  assert len(files) > 10
  assert violations(files, ['jaxprune.channels', 'jaxprune_train']) == []


def test_other_packages_use_structured_only_through_its_public_and_shared_names():
  """`jaxprune.structured`'s `__all__`, and `structured._shared` for what other packages need
  beyond it; its stage packages (`_core`, `_trace`, ...) are its own."""
  stages = sorted(
    p.name for p in (PACKAGE / 'structured').iterdir() if (p / '__init__.py').exists()
  )
  assert {'_core', '_primitives', '_trace', '_select', '_shrink', '_prune'} <= set(stages)
  files = sorted(
    p for package in ('channels', 'oneshot', 'sparse') for p in (PACKAGE / package).rglob('*.py')
  )
  files += sorted(JOB.rglob('*.py'))
  assert violations(files, [f'jaxprune.structured.{s}' for s in stages]) == []


# Inside structured, what each folder may import besides itself (the layers of
# docs/explanation/architecture.md): the core is the bottom, the primitives table and what
# reads it (the traversal, the FLOPs counter, the observer) next, then the stages.
STRUCTURED_LAYERS = {
  '_core': (),
  '_primitives': ('_core',),
  '_trace': ('_core', '_primitives'),
  '_select': ('_core', '_primitives'),
  '_shrink': ('_core', '_primitives', '_trace'),  # a pruned callable retraces
  '_prune': ('_core', '_primitives', '_trace', '_select', '_shrink'),
}


def test_every_structured_folder_has_a_layer():
  folders = {p.name for p in (PACKAGE / 'structured').iterdir() if (p / '__init__.py').exists()}
  assert folders == set(STRUCTURED_LAYERS)


@pytest.mark.parametrize('folder', sorted(STRUCTURED_LAYERS))
def test_structured_folders_import_only_the_layers_below(folder):
  """No arrow runs back up: the core imports no other folder (not the primitives table),
  selection reads the graph (the core), not the trace stage, and so on."""
  allowed = {folder, *STRUCTURED_LAYERS[folder]}
  forbidden = [f'jaxprune.structured.{f}' for f in STRUCTURED_LAYERS if f not in allowed]
  files = sorted((PACKAGE / 'structured' / folder).rglob('*.py'))
  assert files
  assert violations(files, [*forbidden, 'jaxprune.structured._shared']) == []


def test_the_direction_check_sees_nested_and_relative_imports():
  source = '\n'.join(
    [
      'import jaxprune._masks.update',
      'from jaxprune import channels as c',
      'def f():',
      '  if True:',
      '    from ..train import loop',
      '  from . import trace',
    ]
  )
  found = imported_modules(source, 'jaxprune.structured.api', is_package=False)
  assert {
    'jaxprune._masks.update',
    'jaxprune.channels',
    'jaxprune.train.loop',
    'jaxprune.structured.trace',
  } <= found
  assert within('jaxprune.channels.rule', ['jaxprune.channels'])
  assert not within('jaxprune.channelsx', ['jaxprune.channels'])


# Public modules that are not packages: namespaces that only re-export, and scripts.
PUBLIC_MODULES = {
  'jaxprune.functional',  # the torch.nn.utils.prune counterpart (re-exports)
  'jaxprune.methods',  # its pruning criteria (re-exports)
  'jaxprune_train.__main__',  # `python -m jaxprune_train`
}


def test_implementation_modules_are_private():
  """Implementation lives in modules (or folders) whose names start with `_`; a public
  module is a package's `__init__`, a re-exporting namespace or a script."""
  public = set()
  for path in [*PACKAGE.rglob('*.py'), *JOB.rglob('*.py')]:
    parts = path.relative_to(ROOT).with_suffix('').parts
    if path.name == '__init__.py' or any(p.startswith('_') for p in parts[1:]):
      continue
    public.add('.'.join(parts))
  assert public - PUBLIC_MODULES == set()


@pytest.mark.parametrize('name', ['jaxprune.functional', 'jaxprune.methods'])
def test_namespace_modules_only_reexport(name):
  module = importlib.import_module(name)
  tree = ast.parse(pathlib.Path(module.__file__).read_text())
  for node in tree.body:
    assert is_docstring_all_or_getattr(node) or isinstance(node, ast.ImportFrom), node.lineno
  assert all(getattr(module, n).__module__.startswith('jaxprune._') for n in module.__all__)


@pytest.mark.slow
def test_importing_jaxprune_and_its_namespaces_starts_no_backend():
  # The main job calls jax.distributed.initialize after its imports, which must come
  # before JAX's backend starts: no module may make a jax array at import.
  script = (
    'import jaxprune, jaxprune_train, jaxprune.sparse, jaxprune.oneshot, jaxprune.structured\n'
    'import jaxprune.channels, jaxprune.functional, jaxprune.methods\n'
    'from jax._src import xla_bridge\n'
    'print(xla_bridge.backends_are_initialized())\n'
  )
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
  result = subprocess.run(
    [sys.executable, '-c', script], capture_output=True, text=True, env=env, cwd=ROOT, check=True
  )
  assert result.stdout.split() == ['False']
