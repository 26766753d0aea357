"""The README's python examples, by section, for the tests that run them as written."""

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'README.md')


def python_blocks(start: str) -> list[str]:
  """The ```python blocks of the README section that begins at `start` (its
  heading or its `<!-- section:NAME -->` marker), up to the next section marker."""
  with open(README) as f:
    text = f.read()
  assert start in text, f'the README has no {start!r}'
  section = text.split(start, 1)[1].split('<!-- section:', 1)[0]
  return re.findall(r'```python\n(.*?)```', section, flags=re.DOTALL)
