"""Parity of `jaxprune.oneshot` with the authors' code (PyTorch on CPU), layer by layer.

The same float32 weights of a tiny LLaMA-shaped decoder (2 blocks, width 32, 2 heads,
SwiGLU 64; q/k/v/o and gate/up/down pruned, the embedding dense) and the same 8 calibration
sequences of 16 tokens go through the authors' own functions, imported from checkouts at
run time, and through `oneshot.prune`; each row counts the weights whose mask differs and
the largest difference of the pruned weights (SparseGPT updates the kept ones). The
authors' code is not in this repository; get it at the commits the table was measured with:

    mkdir -p ~/refs && cd ~/refs
    git clone https://github.com/locuslab/wanda && git -C wanda checkout 8e8fc87b
    git clone https://github.com/IST-DASLab/sparsegpt && git -C sparsegpt checkout 147d2159
    git clone https://github.com/luuyin/OWL && git -C OWL checkout dddb7a4b
    git clone https://github.com/biomedical-cybernetics/Relative-importance-and-activation-pruning \
      RIA && git -C RIA checkout 7bc55b06
    pip install torch transformers scipy   # what their modules import (CPU torch is enough)
    JAXPRUNE_REFERENCES=~/refs python -m benchmarks.reference_parity   # commits, then tables

`tests/reference_parity_test.py` runs the same comparisons where torch and the checkouts
are found (and is skipped, with the reason, elsewhere). Their data loaders (which download
C4) are replaced by one returning our tokens, `.cuda()` and `torch.cuda.synchronize()` are
no-ops while their code runs, and nothing else of theirs is changed.

Their model-level functions (Wanda's, OWL's, RIA's; SparseGPT's `llama_sequential` without
`--true-sequential`) prune block by block: a block's layers are all measured on the block's
dense inputs (those of the earlier blocks pruned), then pruned together. That is
`oneshot.prune(sequential=r'^layers_\\d+/')`, a regex naming the blocks (`blockwise`
below). One call with `sequential=True` (the default) instead
measures each layer on the outputs of the pruned layers before it in its block, as
SparseGPT's `--true-sequential` does.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import io
import os
import re
import subprocess
import types
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import oneshot

ENV = 'JAXPRUNE_REFERENCES'
BLOCK_REGEX = r'^layers_\d+/'  # the decoder blocks the authors' loops go through, one at a time
REFERENCES = {
  'wanda': ('https://github.com/locuslab/wanda', '8e8fc87b4a2f9955baa7e76e64d5fce7fa8724a6'),
  'sparsegpt': (
    'https://github.com/IST-DASLab/sparsegpt',
    '147d2159dc4f3e9f73e47b32c04d7b3708f44436',
  ),
  'OWL': ('https://github.com/luuyin/OWL', 'dddb7a4bffe27c73e4c8cf692b3a5e36401532c8'),
  'RIA': (
    'https://github.com/biomedical-cybernetics/Relative-importance-and-activation-pruning',
    '7bc55b06924659ea977f7804b773ce3ef0d55c2f',
  ),
}
# The file each comparison imports from its checkout.
_FILES = {
  'wanda': 'lib/prune.py',
  'sparsegpt': 'sparsegpt.py',
  'OWL': 'lib/prune_all.py',
  'RIA': 'lib/prune.py',
}
WIDTH, HEADS, HIDDEN, VOCAB, BLOCKS = 32, 2, 64, 64, 2
SEQUENCES, SEQLEN = 8, 16
OWL_M, OWL_LAM = 5.0, 0.0625  # lam * 2 * 32 inputs is whole: both sides prune whole rows


@dataclasses.dataclass(frozen=True)
class Row:
  """One comparison: what ran, over how many layers and weights, and how far apart."""

  method: str
  setting: str
  layers: int
  weights: int
  mask_differences: int
  max_weight_difference: float
  reference: str

  def markdown(self) -> str:
    name, commit = self.reference.split('@')
    return (
      f'| {self.method} | {self.setting} | {self.layers} | '
      f'{self.mask_differences} of {self.weights} | {self.max_weight_difference:.1e} | '
      f'{name} `{commit[:8]}` |'
    )


def missing() -> str | None:
  """Why the comparison cannot run here (torch not installed, `JAXPRUNE_REFERENCES` unset or
  without the checkouts), or None."""
  try:
    import torch  # noqa: F401
  except ImportError:
    return 'torch is not installed (pip install torch; the CPU build is enough)'
  root = os.environ.get(ENV)
  if not root:
    return (
      f"{ENV} is not set: point it at a folder holding checkouts of the authors' code "
      '(benchmarks/reference_parity.py says which, at which commits)'
    )
  absent = [name for name, file in _FILES.items() if not (Path(root) / name / file).is_file()]
  if absent:
    return f'{ENV}={root} lacks {", ".join(f"{n}/{_FILES[n]}" for n in absent)}'
  return None


def _root() -> Path:
  return Path(os.environ[ENV]).expanduser()


def checkout_commit(repo: str) -> str | None:
  """The commit the checkout of `repo` is at (`git rev-parse HEAD`), or None where it is not
  a git checkout (an exported tree)."""
  return _head(str(_root() / repo))


@functools.cache
def _head(folder: str) -> str | None:
  try:
    done = subprocess.run(
      ['git', '-C', folder, 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=30
    )
  except (OSError, subprocess.SubprocessError):
    return None
  commit = done.stdout.strip()
  return commit if done.returncode == 0 and re.fullmatch(r'[0-9a-f]{40}', commit) else None


def init(seed: int = 0) -> tuple[np.ndarray, dict, np.ndarray]:
  """(embedding (VOCAB, WIDTH), {'layers_i': {name: weight (outputs, inputs)}}, tokens
  (SEQUENCES, SEQLEN)), float32, the input channels of uneven scale."""
  rng = np.random.default_rng(seed)
  embed = rng.normal(size=(VOCAB, WIDTH)) * np.exp(rng.normal(size=WIDTH))
  shapes = {
    'q_proj': (WIDTH, WIDTH),
    'k_proj': (WIDTH, WIDTH),
    'v_proj': (WIDTH, WIDTH),
    'o_proj': (WIDTH, WIDTH),
    'gate_proj': (HIDDEN, WIDTH),
    'up_proj': (HIDDEN, WIDTH),
    'down_proj': (WIDTH, HIDDEN),
  }
  params = {
    f'layers_{i}': {
      name: (rng.normal(size=shape) / np.sqrt(shape[1])).astype(np.float32)
      for name, shape in shapes.items()
    }
    for i in range(BLOCKS)
  }
  tokens = rng.integers(0, VOCAB, (SEQUENCES, SEQLEN))
  return embed.astype(np.float32), params, tokens


def _linear(w: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.einsum('...i,oi->...o', x, w)


def _rms(x: jax.Array) -> jax.Array:
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _block(p: dict, x: jax.Array) -> jax.Array:
  b, t, d = x.shape

  def heads(y):
    return y.reshape(b, t, HEADS, d // HEADS).transpose(0, 2, 1, 3)

  h = _rms(x)
  q, k, v = (heads(_linear(p[n], h)) for n in ('q_proj', 'k_proj', 'v_proj'))
  logits = q @ k.transpose(0, 1, 3, 2) / (d // HEADS) ** 0.5
  logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -jnp.inf)
  attended = (jax.nn.softmax(logits, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
  x = x + _linear(p['o_proj'], attended)
  h = _rms(x)
  up = jax.nn.silu(_linear(p['gate_proj'], h)) * _linear(p['up_proj'], h)
  return x + _linear(p['down_proj'], up)


def model(embed: np.ndarray):
  """`fn(params, tokens)` of the decoder, the embedding a constant (dense on both sides)."""

  def fn(params: dict, tokens: jax.Array) -> jax.Array:
    x = jnp.asarray(embed)[tokens]
    for i in range(len(params)):
      x = _block(params[f'layers_{i}'], x)
    return x

  return fn


def _flat(tree: dict) -> dict[str, np.ndarray]:
  return {f'{b}/{n}': np.asarray(v) for b, layer in tree.items() for n, v in layer.items()}


def blockwise(
  fn: Any, params: dict, batches: list, *, layer_targets: dict | None = None, **kwargs
) -> tuple[dict, dict]:
  """One `oneshot.prune` block by block, as the authors' model-level code goes
  (`sequential=BLOCK_REGEX`: a block's layers measured together on its dense inputs, the earlier
  blocks already pruned); `layer_targets` {name: sparsity} sets layers' own targets.
  Returns (params, masks)."""
  overrides = {f'^{re.escape(name)}$': target for name, target in (layer_targets or {}).items()}
  return oneshot.prune(fn, params, batches, sequential=BLOCK_REGEX, overrides=overrides, **kwargs)


def _one_more_per_block(weights: dict[str, np.ndarray], sparsity: float, blocksize: int = 0):
  """{name: the sparsity that prunes `int(s * size) + 1` weights of each column block (the
  whole layer for blocksize 0)}: the authors' magnitude, RIA (per layer) and SparseGPT
  thresholds keep their scores `<=` the (k+1)-th smallest, so they prune one more than
  `int(s * size)` where no two scores tie. A layer of several blocks gets the share of
  one block, which `oneshot.prune` spreads over the blocks evenly when they are of one
  size."""
  out = {}
  for name, w in weights.items():
    size = w.shape[0] * (blocksize or w.shape[1])
    out[name] = (int(size * sparsity) + 1) / size
  return out


def _compare(
  method: str,
  setting: str,
  reference: dict[str, np.ndarray],
  params: dict,
  masks: dict,
  repo: str,
) -> Row:
  """The row of one comparison: the reference's masks are its nonzero weights (no weight
  of the model is zero before pruning)."""
  params, masks = _flat(params), _flat(masks)
  differences = sum(int(np.sum((reference[n] != 0) != masks[n])) for n in reference)
  weight = max(float(np.max(np.abs(reference[n] - params[n]))) for n in reference)
  return Row(
    method,
    setting,
    len(reference),
    sum(w.size for w in reference.values()),
    differences,
    weight,
    f'{repo}@{checkout_commit(repo) or "unknown"}',
  )


def _quiet(call, *args, **kwargs) -> tuple[Any, str]:
  """(call's result, what it printed): the authors' code prints each layer's progress."""
  from benchmarks import _reference_torch

  out = io.StringIO()
  with contextlib.redirect_stdout(out), _reference_torch.on_cpu():
    result = call(*args, **kwargs)
  return result, out.getvalue()


def _torch_model(embed: np.ndarray, params: dict) -> Any:
  """The decoder in torch, from the same arrays."""
  from benchmarks import _reference_torch

  return _reference_torch.Decoder(embed, params, SEQLEN, HEADS)


def _reference_module(repo: str, tokens: np.ndarray) -> types.ModuleType:
  from benchmarks import _reference_torch

  folder = _root() / repo
  with contextlib.redirect_stdout(io.StringIO()):  # RIA's quant.py prints on import
    module = _reference_torch.load_package(
      f'jaxprune_ref_{repo.lower()}', folder / 'lib', Path(_FILES[repo]).stem
    )
  module.get_loaders = _reference_torch.loader(tokens)
  return module


def _nm(nm: str | None) -> tuple[int, int]:
  return (0, 0) if nm is None else tuple(int(k) for k in nm.split(':'))


def _setting(sparsity: float | None, nm: str | None) -> str:
  return nm if nm else f'{100 * sparsity:g}%'


def magnitude(sparsity: float | None = None, nm: str | None = None) -> list[Row]:
  """Wanda's `prune_magnitude` against `method='magnitude'` over each layer."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  wanda = _reference_module('wanda', tokens)
  args = types.SimpleNamespace(sparsity_ratio=sparsity or 0.0)
  _quiet(wanda.prune_magnitude, args, net, None, torch.device('cpu'), *_nm(nm))
  reference = net.weights()
  fn, batches = model(embed), [tokens]
  setting = _setting(sparsity, nm)
  if nm:
    pruned, masks = blockwise(fn, params, batches, method='magnitude', nm=nm)
    return [_compare('magnitude', setting, reference, pruned, masks, 'wanda')]
  rows = []
  pruned, masks = blockwise(fn, params, batches, method='magnitude', sparsity=sparsity)
  rows.append(_compare('magnitude', setting, reference, pruned, masks, 'wanda'))
  matched = _one_more_per_block(_flat(params), sparsity)
  pruned, masks = blockwise(
    fn, params, batches, method='magnitude', sparsity=sparsity, layer_targets=matched
  )
  rows.append(_compare('magnitude', f'{setting}, count k+1', reference, pruned, masks, 'wanda'))
  return rows


def wanda(sparsity: float | None = None, nm: str | None = None) -> list[Row]:
  """Wanda's `prune_wanda` against `method='wanda'`, block by block and in one call."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  module = _reference_module('wanda', tokens)
  args = types.SimpleNamespace(
    sparsity_ratio=sparsity or 0.0, nsamples=SEQUENCES, seed=0, use_variant=False
  )
  _quiet(module.prune_wanda, args, net, None, torch.device('cpu'), *_nm(nm))
  reference = net.weights()
  fn, batches = model(embed), [tokens]
  target = {'nm': nm} if nm else {'sparsity': sparsity}
  setting = _setting(sparsity, nm)
  pruned, masks = blockwise(fn, params, batches, method='wanda', **target)
  rows = [_compare('Wanda', setting, reference, pruned, masks, 'wanda')]
  pruned, masks = oneshot.prune(fn, params, batches, method='wanda', **target)
  rows.append(
    _compare(
      'Wanda', f'{setting}, layer by layer (sequential=True)', reference, pruned, masks, 'wanda'
    )
  )
  return rows


def sparsegpt_layer(
  sparsity: float | None = None, nm: str | None = None, blocksize: int = 32
) -> list[Row]:
  """The SparseGPT repository's `SparseGPT` class (`add_batch`, `fasterprune`) on one
  layer (48 outputs, 64 inputs, 256 calibration rows) against `method='sparsegpt'`."""
  import torch

  from benchmarks import _reference_torch

  rng = np.random.default_rng(1)
  w = (rng.normal(size=(48, 64)) / 8).astype(np.float32)
  x = (rng.normal(size=(256, 64)) * np.exp(rng.normal(size=64))).astype(np.float32)
  module = _reference_torch.load_sparsegpt(_root() / 'sparsegpt')
  layer = torch.nn.Linear(64, 48, bias=False)
  layer.weight.data = torch.tensor(w)
  solver = module.SparseGPT(layer)
  solver.add_batch(torch.tensor(x[None]), None)
  n, m = _nm(nm)
  _quiet(solver.fasterprune, sparsity or 0.0, n, m, blocksize=blocksize, percdamp=0.01)
  reference = {'layers_0/w': layer.weight.data.numpy().copy()}

  def run(target):
    return oneshot.prune(
      lambda p, x: _linear(p['layers_0']['w'], x),
      {'layers_0': {'w': w}},
      [x],
      method='sparsegpt',
      blocksize=blocksize,
      **target,
    )

  setting = f'{_setting(sparsity, nm)}, one layer, blocks of {blocksize}'
  if nm:
    return [_compare('SparseGPT', setting, reference, *run({'nm': nm}), 'sparsegpt')]
  matched = _one_more_per_block({'w': w}, sparsity, blocksize)['w']
  return [
    _compare('SparseGPT', setting, reference, *run({'sparsity': sparsity}), 'sparsegpt'),
    _compare(
      'SparseGPT', f'{setting}, count k+1', reference, *run({'sparsity': matched}), 'sparsegpt'
    ),
  ]


def sparsegpt_model(sparsity: float | None = None, nm: str | None = None) -> list[Row]:
  """Wanda's `prune_sparsegpt` (the model-level loop around its copy of the `SparseGPT`
  class, blocksize 128, percdamp 0.01) against `method='sparsegpt'` block by block."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  module = _reference_module('wanda', tokens)
  args = types.SimpleNamespace(sparsity_ratio=sparsity or 0.0, nsamples=SEQUENCES, seed=0)
  _quiet(module.prune_sparsegpt, args, net, None, torch.device('cpu'), *_nm(nm))
  reference = net.weights()
  fn, batches = model(embed), [tokens]
  setting = _setting(sparsity, nm)
  if nm:
    pruned, masks = blockwise(fn, params, batches, method='sparsegpt', nm=nm)
    return [_compare('SparseGPT (model)', setting, reference, pruned, masks, 'wanda')]
  matched = _one_more_per_block(_flat(params), sparsity)
  pruned, masks = blockwise(
    fn, params, batches, method='sparsegpt', sparsity=sparsity, layer_targets=matched
  )
  return [_compare('SparseGPT (model)', f'{setting}, count k+1', reference, pruned, masks, 'wanda')]


def sparsegpt_sequential(sparsity: float | None = None, nm: str | None = None) -> list[Row]:
  """The SparseGPT repository's own LLaMA loop (`llama.py`'s `llama_sequential`, blocksize
  128, percdamp 0.01) against `method='sparsegpt'`: with `--true-sequential` (k, v and q;
  then o; then up and gate; then down, each group measured after the ones before it are
  pruned) against one call with `sequential=True`, without it against `blockwise`."""
  from benchmarks import _reference_torch

  embed, params, tokens = init()
  module = _reference_torch.load_sparsegpt(_root() / 'sparsegpt', 'llama.py')
  n, m = _nm(nm)
  fn, batches = model(embed), [tokens]
  target = {'nm': nm} if nm else {'sparsity': sparsity}
  matched = {} if nm else _one_more_per_block(_flat(params), sparsity)
  setting = _setting(sparsity, nm) + ('' if nm else ', count k+1')
  rows = []
  for true_sequential in (True, False):
    net = _torch_model(embed, params)
    module.args = types.SimpleNamespace(
      nsamples=SEQUENCES,
      true_sequential=true_sequential,
      minlayer=-1,
      maxlayer=1000,
      prune_only='',
      invert=False,
      wbits=16,
      sparsity=sparsity or 0.0,
      prunen=n,
      prunem=m,
      percdamp=0.01,
      blocksize=128,
    )
    _quiet(module.llama_sequential, net, _reference_torch.loader(tokens)()[0], 'cpu')
    if true_sequential:
      overrides = {f'^{re.escape(k)}$': v for k, v in matched.items()}
      pruned, masks = oneshot.prune(
        fn, params, batches, method='sparsegpt', overrides=overrides, **target
      )
      label = 'true sequential, layer by layer'
    else:
      pruned, masks = blockwise(
        fn, params, batches, method='sparsegpt', layer_targets=matched, **target
      )
      label = 'block by block'
    rows.append(
      _compare(
        'SparseGPT (llama.py)', f'{setting}, {label}', net.weights(), pruned, masks, 'sparsegpt'
      )
    )
  return rows


def _ria_args(**changes: Any) -> types.SimpleNamespace:
  """The command-line arguments of RIA's `main.py` that `prune_ria` reads: a = 0.5 (its
  default), no reconstruction, no quantisation, 50% unless `changes` say otherwise."""
  args = {
    'sparsity_ratio': 0.5,
    'nsamples': SEQUENCES,
    'seed': 0,
    'seqlen': SEQLEN,
    'calib_dataset': 'c4',
    'model': 'llama',
    'prune_method': 'ria',
    'a': 0.5,
    'reconstruction': False,
    'gptq': False,
    'per_outneuron': False,
    'reallocation': False,
    'semi_sparse_acc': False,
  }
  return types.SimpleNamespace(**(args | changes))


def ria(sparsity: float | None = None, nm: str | None = None, per_row: bool = False) -> list[Row]:
  """RIA's `prune_ria` (exponent a = 0.5, no channel reallocation, no reconstruction)
  against `method='ria'` block by block; `per_row` is its `--per_outneuron`."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  module = _reference_module('RIA', tokens)
  args = _ria_args(sparsity_ratio=sparsity or 0.0, per_outneuron=per_row)
  _quiet(module.prune_ria, args, net, None, torch.device('cpu'), *_nm(nm))
  reference = net.weights()
  fn, batches = model(embed), [tokens]
  setting = _setting(sparsity, nm) + (', per row' if per_row else '')
  if nm or per_row:
    target = {'nm': nm} if nm else {'sparsity': sparsity}
    pruned, masks = blockwise(fn, params, batches, method='ria', per_row=per_row, **target)
    return [_compare('RIA', setting, reference, pruned, masks, 'RIA')]
  pruned, masks = blockwise(fn, params, batches, method='ria', sparsity=sparsity)
  rows = [_compare('RIA', setting, reference, pruned, masks, 'RIA')]
  matched = _one_more_per_block(_flat(params), sparsity)
  pruned, masks = blockwise(
    fn, params, batches, method='ria', sparsity=sparsity, layer_targets=matched
  )
  rows.append(_compare('RIA', f'{setting}, count k+1', reference, pruned, masks, 'RIA'))
  return rows


@dataclasses.dataclass(frozen=True)
class Reallocation:
  """RIA's channel reallocation on one layer: the kept RIA score at N:M after reordering
  the layer's input channels over the kept score before, RIA's heuristic (its code's
  `--reallocation`, importance 'sum', no linear sum assignment) and `oneshot.prune`'s
  `permute=` (which starts from the same heuristic or the identity, then swaps)."""

  layer: str
  reference_gain: float
  gain: float


def ria_reallocation(nm: str = '2:4') -> list[Reallocation]:
  """RIA's `prune_ria --reallocation` against `method='ria', permute=` on the MLP's `down`
  layers, block by block. The other layers read the residual stream, whose channels reach
  the model's output, so `permute` cannot reorder them (RIA's code reallocates their masks
  too: its mask is N:M in a reordered column order over weights left in place, a model
  that needs the reorder applied at run time to use N:M kernels; `permute` reorders the
  weights that hold the channels instead). Block 1's inputs differ between the two sides
  (their block 0 was pruned with other masks), block 0's are the same."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  module = _reference_module('RIA', tokens)
  args = _ria_args(reallocation=True, importance_score='sum', lsa=False)
  _, printed = _quiet(module.prune_ria, args, net, None, torch.device('cpu'), *_nm(nm))
  theirs = {
    f'layers_{block}/{name.split(".")[-1]}': float(after) / float(before)
    for block, name, before, after in re.findall(
      r'pruning layer (\d+) name (\S+)\nThe total value before resort:\s+(\S+)\n'
      r'The total value after heuristic channel reallocation:\s+(\S+)',
      printed,
    )
  }
  fn, batches = model(embed), [tokens]
  out = []
  for i in range(len(params)):
    overrides = {rf'^layers_{j}/': None for j in range(len(params)) if j != i}
    params, _, report = oneshot.prune_with_report(
      fn,
      params,
      batches,
      method='ria',
      nm=nm,
      sequential=False,
      overrides=overrides,
      permute=rf'^layers_{i}/down_proj$',
    )
    (permutation,) = report.permutations
    name = f'layers_{i}/down_proj'
    out.append(Reallocation(name, theirs[name], permutation.kept_after / permutation.kept_before))
  return out


@dataclasses.dataclass(frozen=True)
class OwlParity:
  """OWL's comparison: each block's outlier ratio (a share, not OWL's percent) and
  sparsity on both sides, and the masks' row."""

  reference_ratios: tuple[float, ...]
  ratios: tuple[float, ...]
  reference_sparsities: tuple[float, ...]
  sparsities: tuple[float, ...]
  row: Row


def owl(sparsity: float = 0.5) -> OwlParity:
  """OWL's `prune_wanda_outlier` (M = 5, lambda = 1/16, unstructured) against
  `oneshot.prune_with_report(owl=OWL(groups=r'^layers_\\d+/'), sequential=BLOCK_REGEX)`:
  the ratios, the sparsities (a block's linear layers one group, as OWL's code) and the
  masks of one call."""
  import torch

  embed, params, tokens = init()
  net = _torch_model(embed, params)
  module = _reference_module('OWL', tokens)
  args = types.SimpleNamespace(
    sparsity_ratio=sparsity,
    nsamples=SEQUENCES,
    seed=0,
    use_variant=False,
    Hyper_m=OWL_M,
    Lamda=OWL_LAM,
    model='llama',
  )
  _, printed = _quiet(module.prune_wanda_outlier, args, net, None, torch.device('cpu'))
  found = re.search(r'before adjustment (\[.*?\])', printed)
  reference_ratios = tuple(r / 100 for r in ast.literal_eval(found.group(1)))
  reference = net.weights()
  fn, batches = model(embed), [tokens]
  config = oneshot.OWL(m=OWL_M, lam=OWL_LAM, groups=r'^layers_\d+/')
  pruned, masks, report = oneshot.prune_with_report(
    fn, params, batches, method='wanda', sparsity=sparsity, owl=config, sequential=BLOCK_REGEX
  )

  def per_block(values, block):
    return [v for n, v in values.items() if n.startswith(f'layers_{block}/')]

  def block_sparsity(weights, block):
    zeros = sum(int(np.sum(w == 0)) for w in per_block(weights, block))
    return zeros / sum(w.size for w in per_block(weights, block))

  ratios = {layer.name: layer.outliers for layer in report.layers}
  return OwlParity(
    reference_ratios,
    tuple(per_block(ratios, b)[0] for b in range(BLOCKS)),
    tuple(block_sparsity(reference, b) for b in range(BLOCKS)),
    tuple(block_sparsity(_flat(pruned), b) for b in range(BLOCKS)),
    _compare('OWL + Wanda', f'{100 * sparsity:g}%', reference, pruned, masks, 'OWL'),
  )


def rows() -> tuple[list[Row], OwlParity, list[Reallocation]]:
  """Every comparison of the table."""
  out = []
  out += magnitude(sparsity=0.5)
  out += magnitude(nm='2:4')
  out += wanda(sparsity=0.5)
  out += wanda(nm='2:4')
  out += sparsegpt_layer(sparsity=0.5)
  out += sparsegpt_layer(nm='2:4')
  out += sparsegpt_model(sparsity=0.5)
  out += sparsegpt_model(nm='2:4')
  out += sparsegpt_sequential(sparsity=0.5)
  out += sparsegpt_sequential(nm='2:4')
  out += ria(sparsity=0.5)
  out += ria(sparsity=0.5, per_row=True)
  out += ria(nm='2:4')
  parity = owl(0.5)
  return out + [parity.row], parity, ria_reallocation('2:4')


def main() -> None:
  reason = missing()
  if reason:
    raise SystemExit(f'cannot compare: {reason}.')
  import torch
  import transformers

  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    table, parity, reallocations = rows()
  print(
    f'torch {torch.__version__}, transformers {transformers.__version__}, jax {jax.__version__}'
  )
  for repo, (url, pinned) in REFERENCES.items():
    commit = checkout_commit(repo)
    at = f'at {commit}' if commit else 'not a git checkout: its commit is unknown'
    note = '' if commit in (None, pinned) else f' (the table was measured at {pinned})'
    print(f'{repo}: {url}, {_root() / repo} {at}{note}')
  print()
  print('| method | setting | layers | masks differing | max weight difference | reference |')
  print('|---|---|---|---|---|---|')
  for row in table:
    print(row.markdown())
  print()
  print('OWL outlier ratios per block, reference:', [f'{r:.5f}' for r in parity.reference_ratios])
  print('OWL outlier ratios per block, jaxprune: ', [f'{r:.5f}' for r in parity.ratios])
  print('OWL sparsity per block, reference:', [f'{s:.4f}' for s in parity.reference_sparsities])
  print('OWL sparsity per block, jaxprune: ', [f'{s:.4f}' for s in parity.sparsities])
  print()
  print("| RIA 2:4, kept score after / before reordering | RIA's reallocation | permute= |")
  print('|---|---|---|')
  for r in reallocations:
    print(f'| {r.layer} | {r.reference_gain:.4f} | {r.gain:.4f} |')


if __name__ == '__main__':
  main()
