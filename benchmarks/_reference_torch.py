"""The torch side of `benchmarks/reference_parity.py`: a tiny LLaMA-shaped decoder with the
attributes the authors' model-level functions read, and their modules loaded from
checkouts at run time (none of their code is in this repository).

The authors' functions read `model.model.layers`, `model.model.embed_tokens`,
`model.seqlen`, `model.config.use_cache` and `.hidden_size`, `model.hf_device_map`, find the
`nn.Linear` modules of each block by type, catch the first block's inputs by wrapping it
and reading the keyword arguments `attention_mask` and `position_ids`, and call each block
as `layer(x, attention_mask=..., position_ids=...)[0]`; this model has all of those.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

_EPS = 1e-6


def _rms(x: torch.Tensor) -> torch.Tensor:
  return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + _EPS)


class _Attention(nn.Module):
  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.q_proj = nn.Linear(width, width, bias=False)
    self.k_proj = nn.Linear(width, width, bias=False)
    self.v_proj = nn.Linear(width, width, bias=False)
    self.o_proj = nn.Linear(width, width, bias=False)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape

    def heads(y):
      return y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

    q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
    logits = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    logits = logits.masked_fill(~causal, float('-inf'))
    out = torch.softmax(logits, dim=-1) @ v
    return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class _MLP(nn.Module):
  def __init__(self, width: int, hidden: int):
    super().__init__()
    self.gate_proj = nn.Linear(width, hidden, bias=False)
    self.up_proj = nn.Linear(width, hidden, bias=False)
    self.down_proj = nn.Linear(hidden, width, bias=False)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
  def __init__(self, width: int, heads: int, hidden: int):
    super().__init__()
    self.self_attn = _Attention(width, heads)
    self.mlp = _MLP(width, hidden)

  def forward(self, x, attention_mask=None, position_ids=None):
    del attention_mask, position_ids  # causal attention, no position encoding
    h = x + self.self_attn(_rms(x))
    return (h + self.mlp(_rms(h)),)


class _Inner(nn.Module):
  def __init__(self, embed: np.ndarray, blocks: list[_Block]):
    super().__init__()
    self.embed_tokens = nn.Embedding(*embed.shape)
    self.embed_tokens.weight.data = torch.tensor(embed)
    self.layers = nn.ModuleList(blocks)
    self.norm = nn.Identity()  # the SparseGPT repository's loop moves it between devices


class Decoder(nn.Module):
  """The decoder of `reference_parity.init` in torch, from the same arrays."""

  def __init__(self, embed: np.ndarray, params: dict, seqlen: int, heads: int):
    super().__init__()
    embed = np.array(embed)
    blocks = []
    for i in range(len(params)):
      p = params[f'layers_{i}']
      block = _Block(embed.shape[1], heads, p['gate_proj'].shape[0])
      for name, linear in find_linear(block).items():
        linear.weight.data = torch.tensor(np.array(p[name.split('.')[-1]]))
      blocks.append(block)
    self.model = _Inner(embed, blocks)
    self.seqlen = seqlen
    self.config = types.SimpleNamespace(use_cache=False, hidden_size=embed.shape[1])
    self.hf_device_map: dict = {}

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    x = self.model.embed_tokens(tokens)
    positions = torch.arange(tokens.shape[1])[None]
    for layer in self.model.layers:
      x = layer(x, attention_mask=None, position_ids=positions)[0]
    return x

  def weights(self) -> dict[str, np.ndarray]:
    """{'layers_i/name': weight (outputs, inputs)} of every linear layer."""
    out = {}
    for i, block in enumerate(self.model.layers):
      for name, linear in find_linear(block).items():
        out[f'layers_{i}/{name.split(".")[-1]}'] = linear.weight.data.numpy().copy()
    return out


def find_linear(module: nn.Module) -> dict[str, nn.Linear]:
  return {name: m for name, m in module.named_modules() if type(m) is nn.Linear}


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
  """The authors' code calls `.cuda()` on a tensor to sort it and `torch.cuda.synchronize()`
  to time a layer; on a machine without CUDA both become no-ops while it runs."""
  cuda, synchronize = torch.Tensor.cuda, torch.cuda.synchronize
  torch.Tensor.cuda = lambda self, *args, **kwargs: self
  torch.cuda.synchronize = lambda *args, **kwargs: None
  try:
    yield
  finally:
    torch.Tensor.cuda, torch.cuda.synchronize = cuda, synchronize


def load_package(name: str, folder: Path, module: str) -> types.ModuleType:
  """`folder`'s `module` (e.g. 'prune' of a checkout's `lib/`) as `name.module`, its
  relative imports resolved within `folder`; `name.data` (the authors' data loaders, which
  need the `datasets` package and downloads) is a stub whose `get_loaders` the caller
  replaces."""
  if f'{name}.{module}' in sys.modules:
    return sys.modules[f'{name}.{module}']
  package = types.ModuleType(name)
  package.__path__ = [str(folder)]
  sys.modules[name] = package
  data = types.ModuleType(f'{name}.data')

  def get_loaders(*args, **kwargs):
    raise RuntimeError('set get_loaders on the reference module before calling it')

  data.get_loaders = get_loaders
  sys.modules[f'{name}.data'] = data
  return importlib.import_module(f'{name}.{module}')


def load_sparsegpt(folder: Path, file: str = 'sparsegpt.py') -> types.ModuleType:
  """A module of the SparseGPT repository (`sparsegpt.py`, or `llama.py` with its
  model-level loop), which imports its siblings by plain name."""
  name = f'jaxprune_ref_sparsegpt_{Path(file).stem}'
  if name in sys.modules:
    return sys.modules[name]
  sys.path.insert(0, str(folder))
  try:
    spec = importlib.util.spec_from_file_location(name, folder / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(folder))
  return module


def loader(tokens: np.ndarray):
  """`get_loaders`' stand-in: (one (input, target) pair per calibration sequence, None)."""

  def get_loaders(*args, **kwargs):
    del args, kwargs
    return [(torch.tensor(row[None]), None) for row in tokens], None

  return get_loaders
