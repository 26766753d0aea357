"""The job's persistent compilation cache: a rerun loads its compiled steps from disk.

The pruned train step takes a few seconds to compile on CPU (about 2.2x the same
step with Adam alone), and a run compiles it, its evaluation and its mask
update again each time it starts or resumes. JAX's persistent cache keeps each
compiled program on disk by a hash of the program, the devices and the flags,
so a resumed or repeated run skips those compiles with the same programs (the
same results, bit for bit).
"""

from __future__ import annotations

import os

import jax

# Programs that compile faster than this are not worth a file; the train step
# and the evaluation of even the digits MLP take longer (JAX's default is 1 s).
MIN_COMPILE_SECONDS = 0.2


def default_directory() -> str:
  """`$XDG_CACHE_HOME/jaxprune-train/jax`, by default `~/.cache/jaxprune-train/jax`."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'jaxprune-train', 'jax')


def enable(workdir: str) -> str:
  """Turns JAX's persistent compilation cache on, unless the user set it up already.

  A directory given to JAX (`JAX_COMPILATION_CACHE_DIR`, `jax.config`) is kept;
  else the user's cache directory, or `<workdir>/compilation_cache` where that
  cannot be written. `JAX_ENABLE_COMPILATION_CACHE=false` turns it off.

  Args:
    workdir: the run's directory, the fallback location.

  Returns:
    The line the job prints about it.
  """
  if not jax.config.jax_enable_compilation_cache:
    return 'compilation cache off (JAX_ENABLE_COMPILATION_CACHE=false)'
  directory = jax.config.jax_compilation_cache_dir
  if not directory:
    directory = default_directory()
    try:
      os.makedirs(directory, exist_ok=True)
    except OSError:
      directory = os.path.join(workdir, 'compilation_cache')
    jax.config.update('jax_compilation_cache_dir', directory)
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_SECONDS)
  return (
    f'compilation cache in {directory} (a rerun loads the compiled steps; '
    'JAX_COMPILATION_CACHE_DIR moves it, JAX_ENABLE_COMPILATION_CACHE=false turns it off)'
  )
