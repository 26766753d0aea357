"""The built documentation site as a reader sees it: executed pages free of build noise,
code that fits at 1280 px, search that puts the matching guide first.

The site must be built first (the README's docs command, as CI does); without the build
these tests skip and say why, and the browser ones also skip without headless Chromium.
"""

import html
import html.parser
import json
import os
import re
import subprocess
import uuid

import pytest
from docs_site_test import BUILD, SITE, _chromium, search_page_dom

needs_site = pytest.mark.skipif(
  not os.path.exists(os.path.join(SITE, 'index.html')),
  reason=f'the docs site is not built (docs/_build/html); run: {BUILD}',
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a cell output must not show: progress bars, library banners, the build machine.
NOISE = {
  'a progress bar': re.compile(r'[█▏▎▍▌▋▊▉]|\d+%\|[^|\n]*\||\d+(?:\.\d+)?(?:it/s|s/it|step/s)\]'),
  'a tqdm warning': re.compile(r'TqdmWarning|IProgress not found'),
  "transformers' deprecation banner": re.compile(r'classes are deprecated and will be removed'),
  'a site-packages path': re.compile(r'site-packages'),
  'a temporary path': re.compile(r'/tmp/(?:ipykernel_|tmp)\w*|/var/folders/'),
  "the build machine's checkout path": re.compile(re.escape(ROOT)),
}
# A `...Warning:` line that the page shows on purpose sits in a cell tagged
# `shows-warning` (myst-nb gives the cell the class `tag_shows-warning`).
WARNING_LINE = re.compile(r'^.*\b[A-Z]\w*Warning: .*$', flags=re.MULTILINE)
SHOWS_WARNING = 'tag_shows-warning'


def _pages() -> list[str]:
  pages = []
  for dirpath, dirnames, files in os.walk(SITE):
    dirnames[:] = [d for d in dirnames if d not in ('_static', '_sources', '_images')]
    pages += [os.path.join(dirpath, f) for f in files if f.endswith('.html')]
  return sorted(pages)


class _CellOutputs(html.parser.HTMLParser):
  """Collects, for each myst-nb cell (`<div class="cell ...">`), its classes (a tagged
  cell has `tag_<tag>`) and the text of its outputs (`<div class="cell_output ...">`)."""

  def __init__(self):
    super().__init__()
    self.cells: list[tuple[str, list[str]]] = []
    self._divs: list[str] = []  # the role of each open div: 'cell', 'output' or ''

  def handle_starttag(self, tag, attrs):
    if tag != 'div':
      return
    classes = (dict(attrs).get('class') or '').split()
    if 'cell' in classes:
      self.cells.append((' '.join(classes), []))
      self._divs.append('cell')
    elif 'cell_output' in classes and self.cells:
      self._divs.append('output')
    else:
      self._divs.append('')

  def handle_endtag(self, tag):
    if tag == 'div' and self._divs:
      self._divs.pop()

  def handle_data(self, data):
    if 'output' in self._divs:
      self.cells[-1][1].append(data)


def _cells(page_html: str) -> list[tuple[str, str]]:
  """(the cell's classes, the text of its outputs) for each executed cell of a page."""
  parser = _CellOutputs()
  parser.feed(page_html)
  return [(classes, ''.join(text)) for classes, text in parser.cells]


@pytest.mark.slow
@needs_site
def test_executed_pages_show_no_progress_bars_banners_or_build_paths():
  found = []
  executed = 0
  for path in _pages():
    with open(path, encoding='utf-8') as f:
      cells = _cells(f.read())
    executed += any(text.strip() for _, text in cells)
    for classes, text in cells:
      for what, pattern in NOISE.items():
        match = pattern.search(text)
        if match:
          found.append(f'{os.path.relpath(path, SITE)}: {what}: {match.group(0)!r}')
      if SHOWS_WARNING not in classes.split():
        for line in WARNING_LINE.findall(text):
          found.append(f'{os.path.relpath(path, SITE)}: a warning: {line.strip()[:160]!r}')
  assert executed >= 10, 'the pages were built without executing their cells'
  assert found == [], '\n'.join(found)


def _probe(page: str, check: str) -> list[str]:
  """What the JavaScript `check` finds wrong on `page` in Chromium at 1280 x 900 px.

  `check` runs after the page loaded, with `width` (the window's) in scope, and pushes a
  line for each fault onto `bad`.
  """
  probe = f"""<script>
  window.addEventListener('load', () => {{
    const width = document.documentElement.clientWidth;
    const bad = [];
    {check}
    const out = document.createElement('output');
    out.id = 'overflow-probe';
    out.textContent = JSON.stringify(bad);
    document.body.appendChild(out);
  }});
  </script>"""
  source = os.path.join(SITE, page)
  with open(source, encoding='utf-8') as f:
    text = f.read()
  probe_page = os.path.join(os.path.dirname(source), f'_probe_{uuid.uuid4().hex}.html')
  with open(probe_page, 'w', encoding='utf-8') as f:
    f.write(text.replace('</body>', probe + '</body>'))
  try:
    dom = subprocess.run(
      [
        _chromium(),
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--hide-scrollbars',
        '--window-size=1280,900',
        '--virtual-time-budget=5000',
        '--dump-dom',
        'file://' + probe_page,
      ],
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
    ).stdout
  finally:
    os.remove(probe_page)
  result = re.search(r'<output id="overflow-probe"[^>]*>(.*?)</output>', dom, flags=re.DOTALL)
  assert result, 'the probe did not run'
  return json.loads(html.unescape(result.group(1)))


# An element cut by the edge of the window or of a box above it that clips.
CUT = """
  function cut(element) {
    const range = document.createRange();  // the text's own extent, which may overflow
    range.selectNodeContents(element);
    const box = range.getBoundingClientRect();
    if (box.right > width + 1) return true;
    for (let up = element.parentElement; up; up = up.parentElement) {
      const style = getComputedStyle(up);
      if (style.overflowX !== 'visible' && box.right > up.getBoundingClientRect().right + 1)
        return true;
    }
    return false;
  }
"""


def _overflowing_code(page: str) -> list[str]:
  """The code blocks of `page` that do not fit at 1280 px: wider than their box (so
  characters scroll out of sight) or cut by the edge of the window or of a box above."""
  return _probe(
    page,
    CUT
    + """
    for (const pre of document.querySelectorAll('pre')) {
      if (pre.getBoundingClientRect().width === 0) continue;  // hidden (a collapsed input)
      if (pre.scrollWidth > pre.clientWidth + 1 || cut(pre))
        bad.push(pre.textContent.split('\\n')[0].slice(0, 80));
    }""",
  )


def _broken_sidebar_links(page: str) -> list[str]:
  """The links of `page`'s two sidebars (the site's contents, the page's contents) that a
  reader at 1280 px cannot read whole: cut off, or a word broken over two lines."""
  return _probe(
    page,
    CUT
    + """
    const links = '.bd-sidebar-primary a, .bd-sidebar-secondary a';
    // The lines a text node's words lie on: tops more than 4 px apart (a code span's
    // padding moves a box by a pixel or two, a new line by a line's height).
    function lines(node) {
      const range = document.createRange();
      range.selectNodeContents(node);
      const tops = [...range.getClientRects()].map((r) => r.top).sort((a, b) => a - b);
      return tops.filter((top, i) => i === 0 || top - tops[i - 1] > 4).length;
    }
    for (const a of document.querySelectorAll(links)) {
      const words = a.textContent.trim().split(/\\s+/).filter(Boolean);
      if (a.getBoundingClientRect().width === 0 || words.length === 0) continue;  // collapsed
      const walker = document.createTreeWalker(a, NodeFilter.SHOW_TEXT);
      let broken = false;
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const count = node.textContent.trim().split(/\\s+/).filter(Boolean).length;
        if (count > 0 && lines(node) > count) broken = true;
      }
      if (broken) bad.push('broken mid-word: ' + words.join(' '));
      else if (cut(a)) bad.push('cut off: ' + words.join(' '));
    }""",
  )


@pytest.mark.slow
@needs_site
@pytest.mark.parametrize(
  'page', ['index.html', 'guides/structured.html', 'api/generated/jaxprune.pruning.html']
)
def test_code_blocks_fit_or_wrap_at_1280_px(page):
  assert _overflowing_code(page) == []


@pytest.mark.slow
@needs_site
@pytest.mark.parametrize(
  'page',
  [
    'benchmarks.html',
    'api/jaxprune.html',
    'api/generated/jaxprune.PruningState.html',
    'api/generated/jaxprune.pruning_state_shardings.html',
  ],
)
def test_sidebars_show_every_link_whole_at_1280_px(page):
  assert _broken_sidebar_links(page) == []


@pytest.mark.slow
@needs_site
@pytest.mark.parametrize(
  'query, guide',
  [
    ('wanda', 'guides/oneshot.html'),  # One-shot pruning: magnitude, Wanda, SparseGPT
    ('structured', 'guides/structured.html'),  # Structured pruning
    ('channels', 'guides/channels.html'),  # Gradual channel pruning
  ],
)
def test_search_puts_the_guide_whose_title_matches_first(query, guide):
  dom = search_page_dom(query)
  results = dom.split('class="search"', 1)[1]
  links = re.findall(r'<li[^>]*>\s*<a href="([^"#?]+)', results)
  assert len(links) >= 3, links
  assert links[0] == guide, links[:5]
