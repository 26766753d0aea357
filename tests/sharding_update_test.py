"""One pruning update under jit with shardings on 8 simulated devices equals one device.

The multi-device part runs in a subprocess (tests/sharding_multidevice.py)
because the device count is fixed when jax is imported. Layouts: data parallel
(params replicated), model parallel on a 2x4 mesh (kernels sharded along the
output axis), FSDP (each kernel's first axis divisible by 8 sharded over all 8
devices). The params hold an elementwise kernel, a kernel with 4x4 AVG blocks,
one with whole-row blocks, a conv kernel and an unpruned bias.
"""

import json
import os
import subprocess
import sys

import cpu_devices
import pytest

from jaxprune._search import brackets as brackets

SCRIPT = os.path.join(os.path.dirname(__file__), 'sharding_multidevice.py')
LAYOUTS = ('data_parallel', 'model_parallel', 'fsdp')
# The exact rule compiles slowly on 2 busy cores.
_SLOW = pytest.mark.slow
METHODS = ['histogram', pytest.param('exact', marks=_SLOW)]
METHOD_LAYOUTS = [
  *[('histogram', layout) for layout in LAYOUTS],
  *[pytest.param('exact', layout, marks=_SLOW) for layout in LAYOUTS],
]
DEVICES = 8
# The largest all-reduce allowed: one partial sum per row of the largest leaf (the conv
# kernel's 3*3*16 rows) per candidate threshold, or one partial block average per row and
# device of 'rows' (64 rows, columns sharded; the partitioner ends its halvings with one
# all-reduce and one permute of that size). A whole weight is 2,048 to 8,192 values.
MAX_ALL_REDUCE = max(144 * brackets.PROBES, 64 * DEVICES)


def run_script(*args: str) -> dict:
  """Runs tests/sharding_multidevice.py with 8 simulated CPU devices; its JSON output."""
  env = cpu_devices.env(DEVICES)
  result = subprocess.run(
    [sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600
  )
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def histogram():
  return run_script('update', 'histogram')


@pytest.fixture(scope='module')
def exact():
  return run_script('update', 'exact')


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('layout', LAYOUTS)
def test_masks_and_pruned_params_equal_one_device(request, method, layout):
  result = request.getfixturevalue(method)[layout]
  assert result['masks_equal']
  assert result['pruned_params_equal']


@pytest.mark.parametrize('method, layout', METHOD_LAYOUTS)
def test_thresholds_and_whole_state_equal_one_device(request, method, layout):
  result = request.getfixturevalue(method)[layout]
  assert result['unequal_thresholds'] == []
  assert result['state_equal']


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('layout', LAYOUTS)
def test_masks_sharded_like_params_and_thresholds_replicated(request, method, layout):
  result = request.getfixturevalue(method)[layout]
  assert result['mask_specs_like_params']
  assert result['threshold_specs'] == ['P()']


@pytest.mark.parametrize('method, layout', METHOD_LAYOUTS)
def test_compiled_hlo_has_only_small_reductions(request, method, layout):
  result = request.getfixturevalue(method)[layout]
  kinds = set(result['collective_counts'])
  assert not kinds & {'all-to-all', 'reduce-scatter'}, result['collectives']
  # The moved-weights check is a reduce of two operands (it stores nothing on XLA:CPU),
  # which the partitioner finishes by gathering one partial result per device.
  gathers = [c for c in result['collectives'] if c.startswith('all-gather')]
  assert all(_elements(c) <= DEVICES for c in gathers), result['collectives']
  reductions = [c for c in result['collectives'] if c.startswith('all-reduce')]
  if layout == 'data_parallel':
    assert result['collectives'] == []  # replicated params: nothing crosses devices
  else:
    assert reductions, 'a sharded weight needs cross-device max and counts'
    sizes = [_elements(c) for c in reductions]
    assert max(sizes) <= MAX_ALL_REDUCE, result['collectives']


def _elements(collective: str) -> int:
  """Elements of 'all-reduce f32[3,3,16]' -> 144."""
  dims = collective.split('[', 1)[1].rstrip(']')
  count = 1
  for d in filter(None, dims.split(',')):
    count *= int(d)
  return count


@pytest.mark.slow
def test_explicit_mesh_axes_equal_one_device():
  result = run_script('explicit', 'histogram')
  assert 'error' not in result, result
  assert result['equal']
