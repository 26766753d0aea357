"""Sphinx configuration of the jaxprune documentation site.

Build (from the repository root): `sphinx-build -W --keep-going -b html docs docs/_build/html`.
The pages are MyST markdown; those with code cells are executed notebooks (myst-nb), so
every example on the site runs at build time and the outputs shown are what it printed.
The API reference is generated here, at build time, from the `__all__` of every public
package, so a public name without a page cannot exist.
"""

import importlib
import os
import re
import sys

from sphinx.util import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # document this checkout's jaxprune, not an installed copy
os.environ.setdefault('KERAS_BACKEND', 'jax')
# Notebook kernels are child processes: they import this checkout's jaxprune too.
os.environ['PYTHONPATH'] = os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)

project = 'jaxprune'
author = 'the jaxprune authors'
copyright = '2026, the jaxprune authors'  # noqa: A001 - Sphinx's name

extensions = [
  'myst_nb',
  'sphinx.ext.autodoc',
  'sphinx.ext.autosummary',
  'sphinx.ext.napoleon',
  'sphinx.ext.intersphinx',
  'sphinx.ext.viewcode',
]
exclude_patterns = [
  '_build',
  '_ipython',
  '_templates',
  'README.md',
  '**.ipynb_checkpoints',
  'jupyter_execute',
]
# The API pages are titled by the name alone (_templates/autosummary), and a page's
# contents column lists a class's members without the class's name before each: full
# dotted names do not fit the sidebars at 1280 px except broken mid-word, or cut off.
templates_path = ['_templates']
toc_object_entries_show_parents = 'hide'

# Markdown and notebooks.
myst_enable_extensions = ['colon_fence', 'dollarmath', 'deflist']
myst_heading_anchors = 3  # `page.md#section-title` links resolve
nb_execution_mode = 'cache'  # every cell runs; unchanged pages reuse the cache
nb_execution_cache_path = os.path.join(os.path.dirname(__file__), '_build', '.jupyter_cache')
nb_execution_timeout = 300  # seconds per cell
nb_execution_raise_on_error = True  # a failing example fails the build
nb_execution_show_tb = True
nb_merge_streams = True
# The notebook kernels' own log (ipykernel warns, once per page, that the local TCP
# link to the build is unencrypted) stays out of the build log: their IPython
# profile, docs/_ipython, sets the kernel's log level to errors.
os.environ['IPYTHONDIR'] = os.path.join(os.path.dirname(__file__), '_ipython')
# What a reader should not see in an executed page (tests/docs_html_test.py checks the
# built HTML): progress bars (tqdm's, whose `disable` defaults to this variable) and
# transformers' banner that its Flax classes are deprecated.
os.environ['TQDM_DISABLE'] = '1'
os.environ['TRANSFORMERS_VERBOSITY'] = 'error'

# API reference.
autosummary_generate = True
autodoc_default_options = {'members': True, 'show-inheritance': False}
autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
autoclass_content = 'class'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # NamedTuple fields once, as fields of their class
# The docstrings are written with markdown habits (`name` is code, |w| a magnitude,
# *args a star): `_rst_safe` below turns them into reST before napoleon reads them.
intersphinx_mapping = {
  'python': ('https://docs.python.org/3', None),
}
intersphinx_disabled_reftypes = ['*']  # no network at build time: nothing is fetched
intersphinx_mapping = {}

# Theme: the book theme optax and Flax use.
html_theme = 'sphinx_book_theme'
html_title = 'jaxprune'
html_theme_options = {
  'show_toc_level': 2,
  'navigation_with_keys': False,
  'home_page_in_toc': True,
}
# One search: the header's button (the theme also puts a search field in the sidebar).
html_sidebars = {'**': ['navbar-logo.html', 'icon-links.html', 'sbt-sidebar-nav.html']}
html_static_path = ['_static']
html_css_files = ['custom.css']
# Search: pages whose title matches the query first, guides first among them.
html_search_scorer = os.path.join(os.path.dirname(__file__), '_static', 'search_scorer.js')

# The API pages: one per public package, listing every name in its `__all__`.
PACKAGES = {
  'jaxprune': 'The core: the optax transform, hyperparameters, masks, reports, export, '
  'N:M and sharding helpers.',
  'jaxprune.structured': 'Structured pruning: trace coupled channels, select, shrink, verify.',
  'jaxprune.channels': 'Gradual channel pruning inside the transform.',
  'jaxprune.oneshot': 'One-shot pruning of a trained model: magnitude, Wanda, SparseGPT.',
  'jaxprune.sparse': 'Sparse training from scratch: static, SET, RigL, STE.',
  'jaxprune.functional': 'Masks as functions of a params pytree (torch.nn.utils.prune).',
  'jaxprune.methods': 'Pruning criteria for jaxprune.functional.',
  'jaxprune_train': 'The main job, `jaxprune-train`, as a library.',
}
_API_DIR = os.path.join(os.path.dirname(__file__), 'api')


def _write_api_pages() -> None:
  """Writes docs/api/<package>.rst with an autosummary of the package's `__all__`."""
  os.makedirs(_API_DIR, exist_ok=True)
  for package, blurb in PACKAGES.items():
    names = sorted(importlib.import_module(package).__all__, key=str.lower)
    title = f'``{package}``'
    lines = [
      title,
      '=' * len(title),
      '',
      blurb,
      '',
      f'.. currentmodule:: {package}',
      '',
      '.. autosummary::',
      '   :toctree: generated',
      '   :nosignatures:',
      '',
    ]
    lines += [f'   {name}' for name in names]
    text = '\n'.join(lines) + '\n'
    path = os.path.join(_API_DIR, f'{package}.rst')
    if not os.path.exists(path) or open(path).read() != text:
      with open(path, 'w') as f:
        f.write(text)


_write_api_pages()


# `docs/explanation/semantics.md#schedule` in a docstring (where GitHub readers and
# `help()` see a path): on the site, a link to the page and the section's name.
_DOCS_PATH = re.compile(r'docs/([\w/-]+)\.md(?:#([\w-]+))?')


def _doc_link(match: re.Match) -> str:
  link = f':doc:`/{match[1]}`'
  return f'{link} (section "{match[2].replace("-", " ")}")' if match[2] else link


_BARS = re.compile(r'(?<![\\|])\|(?![|])')  # |w| is a magnitude, not a substitution
_STAR = re.compile(r'(?<![*\\])\*(?![*\s])')  # *args is not emphasis


def _rst_safe(text: str) -> str:
  """A markdown-style docstring as reST: `code` becomes ``code``, |w| and *args escaped.

  Runs before napoleon, so that its parsing of `name: description` never splits a
  code span that holds a colon. Doctest examples (from the first `>>>` on) stay as
  written.
  """
  head, sep, examples = text.partition('>>>')
  if '``' in head:
    return text  # already reST
  parts = head.split('`')
  if len(parts) % 2 == 0:
    return text  # an unpaired backtick: leave it to the warning
  for i in range(0, len(parts), 2):
    parts[i] = _DOCS_PATH.sub(_doc_link, _STAR.sub(r'\\*', _BARS.sub(r'\\|', parts[i])))
  for i in range(1, len(parts), 2):
    after = parts[i + 1][:1]
    parts[i] = f'``{parts[i]}``' + ('\\ ' if after.isalnum() else '')  # ``Struct``\ s
  head = ''.join(parts)
  return head + sep + examples


def _markdown_to_rst(app, what, name, obj, options, lines):
  text = _rst_safe('\n'.join(lines))
  lines[:] = text.split('\n')


def _check_docstrings(app, what, name, obj, options, lines):
  """A public name without a docstring is a warning, so `-W` fails the build."""
  public = name.rsplit('.', 1)
  if what in ('function', 'class') and len(public) == 2 and public[0] in PACKAGES:
    if not ''.join(lines).strip():
      logging.getLogger(__name__).warning(f'{name} has no docstring: the API page is empty')


def setup(app):
  app.connect('autodoc-process-docstring', _markdown_to_rst, priority=100)  # before napoleon
  app.connect('autodoc-process-docstring', _check_docstrings)
