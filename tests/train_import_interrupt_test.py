"""Ctrl-C while the main job is still importing (a second or more: `jaxprune` imports JAX,
Flax and optax): one line, status 130, never Python's `KeyboardInterrupt` traceback. Both
entries: the console script pip writes for pyproject.toml's `[project.scripts]`, and
`python -m jaxprune_train`."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import cpu_devices
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = 'jaxprune-train: interrupted while starting; nothing was written.'

# The script pip writes into the environment's bin/ for a `[project.scripts]` entry.
CONSOLE_SCRIPT = """\
import sys
from {module} import {function}
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit({function}())
"""

# Keeps the job starting for as long as the test needs, should its imports end before the
# signal: the config file is loaded while the flags are parsed.
SLOW_CONFIG = """\
import time


def get_config():
  time.sleep(60)
"""

# Seconds after the job's own code started (see `_start`): 0 is as soon as the test sees it.
# Python's own start-up before that (site, the .pth files, -m's runpy: tens of ms) runs no
# code of the job, and a Ctrl-C there ends as Python does.
MOMENTS = [0.0, 0.02, 0.1, 0.3, 0.6, 1.0]


def console_script(tmp_path) -> str:
  match = re.search(
    r'^jaxprune-train\s*=\s*"([\w.]+):(\w+)"',
    open(os.path.join(ROOT, 'pyproject.toml')).read(),
    re.M,
  )
  assert match, 'pyproject.toml names no jaxprune-train script'
  path = tmp_path / 'jaxprune-train'
  path.write_text(CONSOLE_SCRIPT.format(module=match[1], function=match[2]))
  return str(path)


def _imported(line: bytes) -> str | None:
  """The module an `-X importtime` line reports imported, or None for another line."""
  if not line.startswith(b'import time:') or line.count(b'|') != 2:
    return None
  return line.rsplit(b'|', 1)[1].strip().decode()


def _ours(module: str | None) -> bool:
  """The job's entry, whose `run` puts the start-up answer in place before any other import
  (not, say, site's `__editable___jaxprune_..._finder`)."""
  return module == 'jaxprune_train._entry'


def _start(
  command: list[str],
) -> tuple[subprocess.Popen, list[bytes], threading.Event, threading.Thread]:
  """Starts `command` with `-X importtime`, which reports each import on stderr as it
  ends. The job's own code has started (Python's start-up, site and `-m`'s runpy are
  before it) at the first import that ends after the entry's (`_ours`).

  Returns the process, its stderr lines as they come, the event set then, and the thread
  that reads them.
  """
  env = cpu_devices.env(1)
  env['PYTHONPATH'] = os.pathsep.join(p for p in [ROOT, env.get('PYTHONPATH', '')] if p)
  job = subprocess.Popen(
    [sys.executable, '-X', 'importtime', *command],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    env=env,
    cwd=ROOT,
  )
  lines: list[bytes] = []
  started = threading.Event()

  def read() -> None:
    seen_ours = False
    for line in job.stderr:
      lines.append(line)
      module = _imported(line)
      if module is not None and seen_ours:
        started.set()
      seen_ours = seen_ours or _ours(module)
    started.set()  # stderr closed: the process ended

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  return job, lines, started, reader


@pytest.mark.slow
@pytest.mark.parametrize('moment', MOMENTS)
@pytest.mark.parametrize('entry', ['console_script', 'python_m'])
def test_ctrl_c_while_importing_is_one_line(tmp_path, entry, moment):
  config = tmp_path / 'slow_config.py'
  config.write_text(SLOW_CONFIG)
  flags = ['--config', str(config), f'--workdir={tmp_path / "run"}']
  if entry == 'console_script':
    command = [console_script(tmp_path), *flags]
  else:
    command = ['-m', 'jaxprune_train', *flags]
  job, lines, started, reader = _start(command)
  try:
    assert started.wait(60), 'the job did not start within 60 s'
    assert job.poll() is None, b''.join(lines)[-3000:]
    time.sleep(moment)
    job.send_signal(signal.SIGINT)
    status = job.wait(20)
  finally:
    job.kill()
    job.wait()
    reader.join(10)
    job.stderr.close()
  text = b''.join(lines).decode(errors='replace')
  own = [line for line in text.splitlines() if line.strip() and _imported(line.encode()) is None]
  assert 'Traceback' not in text and 'KeyboardInterrupt' not in text, '\n'.join(own[-40:])
  assert own == [LINE], own[-40:]
  assert status == 130
  assert not (tmp_path / 'run').exists()
