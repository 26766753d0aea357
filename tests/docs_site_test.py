"""The built documentation site, as a reader's browser shows it.

Opens the landing page and the API page of `jaxprune.pruning` in headless Chromium
(Debian's `chromium`, which `.ci/run` installs) and checks what a reader sees: the
title, the executed example's output, the signature, and links that lead to pages and
anchors that exist. Build the site first (the README's docs command); without the
build or without Chromium these tests skip and say why.
"""

import html
import os
import re
import shutil
import subprocess
import urllib.parse

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, 'docs', '_build', 'html')
BUILD = 'sphinx-build -W --keep-going -b html docs docs/_build/html'

needs_site = pytest.mark.skipif(
  not os.path.exists(os.path.join(SITE, 'index.html')),
  reason=f'the docs site is not built (docs/_build/html); run: {BUILD}',
)


def _chromium() -> str:
  for name in ('chromium', 'chromium-browser', 'google-chrome'):
    path = shutil.which(name)
    if path:
      return path
  pytest.skip('no headless Chromium on this machine (Debian: apt-get install -y chromium)')


def _rendered(page: str) -> str:
  """The page's DOM after Chromium has loaded it and run its scripts."""
  result = subprocess.run(
    [
      _chromium(),
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--dump-dom',
      'file://' + os.path.join(SITE, page),
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  return result.stdout


def _text(dom: str) -> str:
  """What a reader reads: the DOM without scripts, styles and tags, spaces collapsed."""
  dom = re.sub(r'<(script|style)\b.*?</\1>', ' ', dom, flags=re.DOTALL)
  return ' '.join(html.unescape(re.sub(r'<[^>]+>', ' ', dom)).split())


def _ids(path: str) -> set[str]:
  with open(path) as f:
    return set(re.findall(r'\bid="([^"]+)"', f.read()))


def _broken_links(page: str, dom: str) -> list[str]:
  """The relative links of `dom` whose file, or whose anchor in that file, is missing."""
  broken = []
  for href in set(re.findall(r'\bhref="([^"]+)"', dom)):
    href = html.unescape(href)
    parts = urllib.parse.urlsplit(href)
    if parts.scheme in ('http', 'https', 'mailto', 'javascript'):
      continue
    if parts.scheme == 'file':
      target = parts.path
    elif parts.path:
      target = os.path.normpath(
        os.path.join(os.path.dirname(os.path.join(SITE, page)), urllib.parse.unquote(parts.path))
      )
    else:
      target = os.path.join(SITE, page)
    if os.path.isdir(target):
      target = os.path.join(target, 'index.html')
    if not os.path.exists(target):
      broken.append(href)
    elif parts.fragment and target.endswith('.html') and parts.fragment not in _ids(target):
      broken.append(href)
  return sorted(broken)


@pytest.mark.slow
@needs_site
def test_landing_page_shows_the_title_the_example_and_working_links():
  dom = _rendered('index.html')
  assert re.search(r'<title>\s*jaxprune', dom), 'the browser tab says jaxprune'
  text = _text(dom)
  assert 'jaxprune prunes neural networks written in JAX' in text
  # The example ran when the site was built: its printed output is on the page. The
  # histogram threshold lands at most one bin of 256 below the 90% and 50% targets.
  shown = {
    name: float(value)
    for name, value in re.findall(r'(layers_[024]/kernel): (\d+\.\d)% zeros', text)
  }
  assert set(shown) == {'layers_0/kernel', 'layers_2/kernel', 'layers_4/kernel'}
  assert 90 - 100 / 256 <= shown['layers_0/kernel'] <= 90.0
  assert 50 - 100 / 256 <= shown['layers_4/kernel'] <= 50.0
  # Navigation: the guides, the API reference and the search page are linked.
  for title in (
    'Gradual magnitude pruning',
    'Structured pruning',
    'The exact semantics',
    'API reference',
    'Benchmarks',
  ):
    assert title in text
  assert 'search.html' in dom
  assert _broken_links('index.html', dom) == []


@pytest.mark.slow
@needs_site
def test_api_page_of_pruning_shows_its_signature_and_docstring():
  page = 'api/generated/jaxprune.pruning.html'
  dom = _rendered(page)
  text = _text(dom)
  assert re.search(r'jaxprune\s*\.\s*pruning\s*\(\s*hparams', text), text[:2000]
  for part in (
    'sparsity_fn',
    'prune_filter',
    'mask_rule',
    'GradientTransformation',
    'Chain it after the optimizer',
  ):
    assert part in text
  assert '>>> ' in text or '&gt;&gt;&gt;' in dom  # the doctest example is shown
  assert _broken_links(page, dom) == []


@needs_site
def test_every_public_name_has_an_api_page_and_the_search_index_is_built():
  import importlib

  import jaxprune

  packages = ['jaxprune', *(f'jaxprune.{p}' for p in jaxprune._NAMESPACES), 'jaxprune_train']
  missing = [
    f'{p}.{name}'
    for p in packages
    for name in importlib.import_module(p).__all__
    if not os.path.exists(os.path.join(SITE, 'api', 'generated', f'{p}.{name}.html'))
  ]
  assert missing == []
  with open(os.path.join(SITE, 'searchindex.js')) as f:
    index = f.read()
  assert 'pruning' in index and 'semantics' in index


@needs_site
def test_docs_references_in_the_code_point_at_anchors_that_exist():
  """Comments and docstrings cite `docs/<page>.md#<anchor>`: each page and anchor exists."""
  cited = set()
  for folder in ('jaxprune', 'jaxprune_train', 'tests', 'benchmarks'):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in files:
        if name.endswith('.py'):
          with open(os.path.join(dirpath, name)) as f:
            text = f.read()
          for page, anchors in re.findall(
            r'docs/([\w/]+)\.md((?:#[\w-]+(?:,? (?:and )?)?)*)', text
          ):
            for anchor in re.findall(r'#([\w-]+)', anchors) or ['']:
              cited.add((page, anchor))
  assert ('explanation/semantics', 'histogram-thresholds') in cited
  missing = []
  for page, anchor in sorted(cited):
    path = os.path.join(SITE, page + '.html')
    if not os.path.exists(path) or (anchor and anchor not in _ids(path)):
      missing.append(f'docs/{page}.md#{anchor}')
  assert missing == []


def search_page_dom(query: str) -> str:
  """The built search page's DOM for `query`, after the browser ran its JavaScript over the
  search index."""
  return subprocess.run(
    [
      _chromium(),
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--virtual-time-budget=10000',
      '--dump-dom',
      'file://' + os.path.join(SITE, 'search.html') + f'?q={query}',
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  ).stdout


@pytest.mark.slow
@needs_site
def test_search_finds_the_semantics_page():
  """The search page, run by the browser's JavaScript over the built search index."""
  assert 'explanation/semantics.html#histogram-thresholds' in search_page_dom('histogram+threshold')
