"""The environment of a test subprocess with simulated CPU devices."""

import os


def env(devices: int, **extra: str) -> dict[str, str]:
  """This process's environment with `devices` CPU devices (JAX fixes the count when it
  starts): the test run's own XLA flags (conftest.py) are kept."""
  flags = f'{os.environ.get("XLA_FLAGS", "")} --xla_force_host_platform_device_count={devices}'
  return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS='cpu', **extra)
