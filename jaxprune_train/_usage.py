"""The command line's words: `--help` with every config field, and one-line flag errors.

`--help` lists the three flags and every field of the config (the one given
with `--config`, else the default) with its value and meaning. A flag that
cannot be parsed (a missing or broken config file, a misspelled field, a
value of the wrong type) becomes one line naming the flag, the value and the
fix, instead of the tracebacks ml_collections and absl raise.
"""

from __future__ import annotations

import ast
import difflib
import errno
import importlib.machinery
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from jaxprune._config.fields import FIELD_DOCS
from jaxprune_train import _defaults as defaults

HELP_FLAGS = frozenset({'--help', '-help', '-h', '-?', '--helpshort', '-helpshort'})
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '_defaults.py')
_KINDS = {
  bool: 'True or False',
  int: 'an integer',
  float: 'a number',
  str: 'a string',
  tuple: 'a tuple such as "(2, 4)"',
}


def config_argument(argv: Sequence[str]) -> str | None:
  """The value of `--config` in `argv` (`--config=x.py` or `--config x.py`), or None."""
  for i, arg in enumerate(argv):
    match = re.fullmatch(r'--?config(?:=(.*))?', arg)
    if match:
      if match.group(1) is not None:
        return match.group(1)
      return argv[i + 1] if i + 1 < len(argv) else ''
  return None


def load_config(path: str) -> ml_collections.ConfigDict:
  """Loads a config file as `--config` does (`file.py` or `file.py:argument`).

  Raises:
    Exception: whatever loading it raises (see `describe_config_error`).
  """
  file, *argument = path.split(':', 1)
  if not os.path.isfile(file):
    raise FileNotFoundError(errno.ENOENT, 'no such file', file)
  # As ml_collections loads it: any file name, not only *.py.
  loader = importlib.machinery.SourceFileLoader('jaxprune_train_config', file)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  loader.exec_module(module)
  return ensure_loaded(module.get_config(*argument))


def ensure_loaded(config: Any) -> ml_collections.ConfigDict:
  """Returns `config` if it is a ConfigDict; raises why the config file did not load if not."""
  if not isinstance(config, ml_collections.ConfigDict):
    # A file that cannot be found or read gives a stand-in that raises its error when used.
    getattr(config, 'keys', None)
    raise TypeError(
      f'get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict'
    )
  return config


def _flatten(config: Mapping[str, Any], prefix: str = '') -> list[tuple[str, Any]]:
  fields = []
  for key, value in config.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      fields += _flatten(value, f'{prefix}{key}.')
    else:
      fields.append((f'{prefix}{key}', value))
  return fields


def help_text(doc: str, flag_lines: Sequence[str], argv: Sequence[str]) -> str:
  """The text of `--help`.

  Args:
    doc: the program's usage text.
    flag_lines: one line per flag of the program.
    argv: the command line, for the `--config` whose fields are listed.

  Returns:
    The usage, the flags, and every config field with its value and meaning.
  """
  path = config_argument(argv) or DEFAULT_CONFIG
  note = ''
  try:
    config = load_config(path)
  except Exception as err:  # noqa: BLE001 -- --help still lists the defaults
    config = defaults.get_config()
    note = f' ({describe_config_error(path, err)}; showing the defaults)'
  source = 'the defaults' if path == DEFAULT_CONFIG else path
  fields = [(f'--config.{name}={_shown(name, value)}', name) for name, value in _flatten(config)]
  width = min(max(len(setting) for setting, _ in fields), 44)
  meaning = {
    **defaults.FIELD_HELP,
    **{f'pruning.{name}': text for name, text in FIELD_DOCS.items()},
  }
  lines = [
    doc.strip(),
    '',
    'Flags:',
    *flag_lines,
    '',
    *bundled_configs(),
    f'Config fields, with the values of {source}{note}:',
  ]
  lines += [
    f'  {setting.ljust(width)}  {meaning.get(name, "")}'.rstrip()
    for setting, name in fields
    if not name.startswith('pruning.')
  ]
  lines += ['', f'Pruning fields: {defaults.FIELD_HELP["pruning"]}.']
  lines += [
    f'  {setting.ljust(width)}  {meaning.get(name, "")}'.rstrip()
    for setting, name in fields
    if name.startswith('pruning.')
  ]
  return '\n'.join(lines)


def bundled_configs() -> list[str]:
  """Lines of `--help` naming each config of the clone's `configs/` with its docstring's first
  line (none for an install without the folder)."""
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
  try:
    names = sorted(n for n in os.listdir(folder) if n.endswith('.py') and not n.startswith('_'))
  except OSError:
    return []
  relative = os.path.relpath(folder)
  shown = folder if relative.startswith('..') else relative
  rows = []
  for name in names:
    try:
      with open(os.path.join(folder, name), encoding='utf-8') as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ''
    except (OSError, SyntaxError, ValueError):
      doc = ''
    rows.append((os.path.join(shown, name), doc.strip().split('\n')[0]))
  width = max(len(path) for path, _ in rows) if rows else 0
  return [
    'Bundled configs (--config PATH; any field can then be overridden):',
    *[f'  {path.ljust(width)}  {doc}'.rstrip() for path, doc in rows],
    '',
  ]


def _shown(name: str, value: Any) -> str:
  """A field's value as it is written on the command line."""
  if name.endswith('_map') and isinstance(value, (tuple, list)):
    # The hparams store an empty map as ('',): shown as the flag that sets it.
    return '"[' + ', '.join(repr(entry) for entry in value if entry) + ']"'
  return repr(value)


def describe_config_error(path: str, err: BaseException) -> str:
  """One line saying why the config file `path` did not load, and what to do."""
  file = path.split(':', 1)[0]
  if not file:
    return '--config is empty; give a config file such as configs/digits_cnn.py'
  if not os.path.isfile(file):
    return (
      f'--config={path}: no such file (relative to {os.getcwd()}); give a config file '
      'such as configs/digits_cnn.py, or leave --config out for the default'
    )
  root = err
  while root.__cause__ is not None or root.__context__ is not None:
    root = root.__cause__ or root.__context__
  if isinstance(root, SyntaxError):
    reason = f'{root.msg} at line {root.lineno}'
  else:
    text = str(root).strip().splitlines()
    # ml_collections embeds the traceback of an error in get_config(); its last line says it.
    reason = text[-1] if text else type(root).__name__
    if not reason.startswith(type(root).__name__):
      reason = f'{type(root).__name__}: {reason}'
  return (
    f'--config={path}: loading it failed ({reason}); a config file defines '
    'get_config() returning an ml_collections.ConfigDict'
  )


def _missing_field(config: Any, dotted: str) -> str | None:
  """Says which part of `dotted` is not a field of `config`, with the closest one, or None."""
  node, walked = config, []
  for key in dotted.split('.'):
    fields = list(node.keys()) if isinstance(node, (Mapping, ml_collections.ConfigDict)) else []
    if key not in fields:
      where = f'config.{".".join(walked)}' if walked else 'the config'
      close = difflib.get_close_matches(key, fields, n=1)
      hint = f"; did you mean '{close[0]}'?" if close else '; jaxprune-train --help lists them'
      return f'{where} has no field {key!r}{hint}'
    node, walked = node[key], [*walked, key]
  return None


def describe_flag_error(err: BaseException, argv: Sequence[str]) -> str:
  """One line for an error raised while parsing the command line.

  Args:
    err: the exception absl's or ml_collections' flag parsing raised.
    argv: the command line.

  Returns:
    A message naming the flag, the value and the fix.
  """
  given = config_argument(argv)
  path = DEFAULT_CONFIG if given is None else given
  try:
    config = load_config(path)
  except Exception as load_err:  # noqa: BLE001 -- every failure to load is described
    return describe_config_error(path, load_err)
  for arg in argv[1:]:
    match = re.fullmatch(r'--?(?:no)?config\.([\w.]+)(?:=(.*))?', arg)
    if match:
      missing = _missing_field(config, match.group(1))
      if missing:
        return f'{arg}: {missing}'
  text = ' '.join(str(err).split())
  value_error = re.fullmatch(r'flag --config\.([\w.]+)=(.*?): (.*)', text)
  if value_error:
    name, value, reason = value_error.groups()
    default = dict(_flatten(config)).get(name)
    kind = _KINDS.get(type(default), type(default).__name__)
    return f'--config.{name}={value}: {reason}; the field takes {kind}, e.g. {default!r}'
  return text if text else type(err).__name__


def repeated_flag(argv: Sequence[str]) -> str | None:
  """Says which flag of `argv` is given twice, with both values, or None.

  absl takes the last value of a flag given twice, except that ml_collections
  appends a tuple field's values (`--config.model.features="(32,16)"` then
  `"(8,)"` gave (32, 16, 8)): either way one of the two is dropped or changed
  without a word, so a repeated flag is an error.
  """
  seen: dict[str, tuple[str, str]] = {}  # name (and its --no form) -> (flag, value)
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == '--':
      break
    match = re.fullmatch(r'--?([A-Za-z_][\w.]*)(?:=(.*))?', arg, re.S)
    if not match or match.group(1) in ('flagfile', 'undefok'):
      continue
    name, value = match.groups()
    if value is None:  # `--name value`, or a boolean `--name` / `--noname`
      following = args[i + 1] if i + 1 < len(args) else None
      value = following if following is not None and not following.startswith('-') else arg
    if name in seen:
      first, before = seen[name]
      also = '' if first == name else f' (as --{first})'
      return (
        f'--{name} is given twice{also}: {before!r}, then {value!r}; give each flag once '
        '(of two values, one would be dropped or both mixed without a word).'
      )
    seen[name] = seen[name[2:] if name.startswith('no') else f'no{name}'] = (name, value)
  return None
