"""The documentation's sources, as a newcomer reads them before any build: the API index,
the benchmarks page's wording, the commands the README and the tests share, the extras.

Fast checks of the files themselves; tests/docs_site_test.py and tests/docs_html_test.py
check the built site.
"""

import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs')


def _read(*path: str) -> str:
  with open(os.path.join(ROOT, *path)) as f:
    return f.read()


def _api_table() -> dict[str, list[str]]:
  """The rows of docs/api/index.md's module table: module -> its other cells."""
  rows = {}
  for line in _read('docs', 'api', 'index.md').splitlines():
    cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
    if line.startswith('| `jaxprune'):
      rows[cells[0].strip('`')] = cells[1:]
  return rows


def test_api_index_says_what_each_public_module_is_for_and_when_to_use_it():
  import jaxprune

  public = ['jaxprune', *(f'jaxprune.{name}' for name in jaxprune._NAMESPACES), 'jaxprune_train']
  rows = _api_table()
  assert sorted(rows) == sorted(public)
  for module, (what, when, start) in rows.items():
    assert what and when, f'{module}: say what it is for and when to use it'
    names = re.findall(r'`([\w.]+)`', start)
    assert names, f'{module}: name where to start'
    exported = importlib.import_module(module).__all__
    assert [n for n in names if n not in exported] == [], module


def test_api_index_reads_as_plain_markdown_on_github():
  """No MyST role outside the toctree, which GitHub would show as raw `{doc}` text."""
  text = _read('docs', 'api', 'index.md')
  outside_fences = re.sub(r'```.*?```', '', text, flags=re.DOTALL)
  assert re.findall(r'\{\w+\}`', outside_fences) == []
  # Every package page the site builds is in the toctree, in the table's order.
  toctree = re.search(r'```\{toctree\}\n(?::.*\n)*\n(.*?)```', text, flags=re.DOTALL)
  assert toctree.group(1).split() == list(_api_table())


def _section(text: str, heading: str) -> str:
  return text.split(f'\n## {heading}\n', 1)[1].split('\n## ', 1)[0]


def test_benchmarks_page_leads_with_what_users_decide_by():
  """The first section answers "what does pruning cost me, which option for a large
  model, and what quality does each give": each with a measured number, and the
  engineering detail on the contributors' page it links to."""
  text = _read('docs', 'benchmarks.md')
  headings = re.findall(r'^## (.+)$', text, flags=re.MULTILINE)
  assert headings[0] == 'For users: what pruning costs, and which option to pick'
  box = _section(text, headings[0])
  rows = [line for line in box.splitlines() if line.startswith('| ') and '---' not in line]
  topics = [row.split('|')[1].strip() for row in rows[1:]]
  assert topics == ['step time', 'memory', 'compile time', 'quality']
  for row in rows[1:]:
    assert re.search(r'\d\.\d+x|\d+(\.\d+)?%', row), row  # a measured ratio or share
  assert "mask_source='params'" in box
  assert 'explanation/step_cost.md' in box
  assert 'not met' not in box


def test_pages_speak_to_a_reader_who_knows_only_the_library():
  """No wording from the project's history ("this round", "the old plan")."""
  history = re.compile(
    r'\b(this|last|previous|next) round\b|\bold plan\b|\bbefore this change\b|'
    r'\blent to (this|the) project\b',
    flags=re.IGNORECASE,
  )
  found = []
  for dirpath, dirnames, files in os.walk(DOCS):
    dirnames[:] = [d for d in dirnames if not d.startswith('_')]
    for name in files:
      if name.endswith('.md') and name != 'changelog.md':
        path = os.path.join(dirpath, name)
        with open(path) as f:
          for number, line in enumerate(f, 1):
            if history.search(line):
              found.append(f'{os.path.relpath(path, ROOT)}:{number}: {line.strip()}')
  assert found == []


def test_every_executed_page_names_its_language_so_the_quick_build_highlights_it():
  """Without a language the quick build (no kernel) warns once per cell and shows the
  code unhighlighted: `No source code lexer found for notebook cell`."""
  missing = []
  for dirpath, dirnames, files in os.walk(DOCS):
    dirnames[:] = [d for d in dirnames if not d.startswith('_')]
    for name in files:
      if name.endswith('.md'):
        path = os.path.join(dirpath, name)
        with open(path) as f:
          text = f.read()
        front = text.split('---', 2)[1] if text.startswith('---') else ''
        if 'file_format: mystnb' in front and not re.search(
          r'^kernelspec:\n(?:  .*\n)*  language: python$', front, flags=re.MULTILINE
        ):
          missing.append(os.path.relpath(path, ROOT))
  assert missing == []


def test_the_readme_has_the_docs_command_the_site_tests_name():
  from docs_site_test import BUILD

  readme = _read('README.md')
  assert f'pip install -e ".[docs]" && {BUILD}' in readme
  assert BUILD in _read('.ci', 'run')
  assert BUILD in _read('docs', 'contributing.md')


def test_the_main_jobs_extra_leaves_out_the_notebook_stack_the_tests_install():
  tomllib = pytest.importorskip('tomllib')  # Python 3.11+, as CI
  extras = tomllib.loads(_read('pyproject.toml'))['project']['optional-dependencies']

  def names(extra):
    return {re.split(r'[<>=\[; ]', spec)[0].lower() for spec in extras[extra]}

  notebook = {'ipykernel', 'nbconvert', 'nbclient', 'nbformat', 'jupyter', 'notebook'}
  assert names('examples') & notebook == set()
  # tests/train_notebook_test.py runs colabs/quickstart.ipynb in a kernel.
  assert {'ipykernel', 'nbclient', 'nbformat'} <= names('test')
  assert 'jaxprune[examples]' in extras['test'] and 'jaxprune[examples]' in extras['docs']


def _conf():
  import importlib.util

  spec = importlib.util.spec_from_file_location('docs_conf', os.path.join(DOCS, 'conf.py'))
  conf = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(conf)
  return conf


def test_a_docs_path_in_a_docstring_is_a_link_on_the_site():
  rst_safe = _conf()._rst_safe
  assert rst_safe(
    'As in docs/explanation/semantics.md#exact-thresholds, see docs/api/index.md.'
  ) == ('As in :doc:`/explanation/semantics` (section "exact thresholds"), see :doc:`/api/index`.')
  assert rst_safe('`docs/guides/sparse.md` |w|') == '``docs/guides/sparse.md`` \\|w\\|'


def test_the_readme_fits_a_page_and_gives_both_tiers_with_their_times():
  lines = _read('README.md').splitlines()
  assert len(lines) < 100
  assert [line for line in lines if len(line) > 90] == []  # clipped on the landing page
  text = ' '.join(lines)
  assert 'pytest -m "not slow"' in text
  assert re.search(r'trains in \d+ s', text) and re.search(r'tests in \d+ min', text)
