"""The code cells of the documentation pages, for the tests that run them as written.

The pages in docs/ are MyST notebooks whose code cells the site build executes; these
tests run the same cells and check the numbers they print against values worked out
independently, so the docs and the tests cannot drift apart.
"""

import os
import re

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs')


def code_cells(page: str, start: str | None = None, end: str | None = None) -> list[str]:
  """The ```{code-cell} sources of docs/`page`, between the texts `start` and `end`.

  Args:
    page: the page's path under docs/, e.g. 'guides/sparse.md'.
    start: text at which to begin (a heading, a sentence); the page's start if None.
    end: text before which to stop; the page's end if None.
  """
  with open(os.path.join(DOCS, page)) as f:
    text = f.read()
  if start is not None:
    assert start in text, f'docs/{page} has no {start!r}'
    text = text.split(start, 1)[1]
  if end is not None:
    assert end in text, f'docs/{page} has no {end!r} after {start!r}'
    text = text.split(end, 1)[0]
  cells = re.findall(r'```\{code-cell\}[^\n]*\n(.*?)```', text, flags=re.DOTALL)
  # A cell may open with MyST options (`:tags: [hide-input]`) and a blank line.
  return [re.sub(r'\A(?::[^\n]*\n)+\n?', '', cell) for cell in cells]
