"""One-shot pruning of trained models from calibration batches: magnitude, Wanda
(Sun et al. 2023), SparseGPT (Frantar & Alistarh 2023) and RIA (Zhang et al. 2024),
unstructured or N:M, with OWL's layer-wise sparsities (Yin et al. 2023) and DSnoT's mask
fix-up (Zhang et al. 2023), of matmul and convolution weights, also those stacked under a
`lax.scan`; `prune_with_report` also reports each layer's sparsity and reconstruction
error; `prune_offloaded` and `prune_checkpoint` prune a model larger than the device one
block at a time, from host memory or an orbax checkpoint; `matmul_weights` gives the weights
it prunes to the gradual transform as its `prune_filter`."""

from jaxprune._attributes import suggesting_getattr
from jaxprune.oneshot._api import METHODS, prune, prune_with_report
from jaxprune.oneshot._dsnot import DSnoT
from jaxprune.oneshot._layers import Layer, Site, Stack, find_layers
from jaxprune.oneshot._offload import prune_checkpoint, prune_offloaded
from jaxprune.oneshot._owl import OWL
from jaxprune.oneshot._permute import Permutation
from jaxprune.oneshot._reorder import permute_channels
from jaxprune.oneshot._report import LayerReport, Report
from jaxprune.oneshot._weights import MatmulWeights, matmul_weights

__all__ = [
  'METHODS',
  'OWL',
  'DSnoT',
  'Layer',
  'LayerReport',
  'MatmulWeights',
  'Permutation',
  'Report',
  'Site',
  'Stack',
  'find_layers',
  'matmul_weights',
  'permute_channels',
  'prune',
  'prune_checkpoint',
  'prune_offloaded',
  'prune_with_report',
]

# A misspelt name suggests the nearest public one (`oneshot.prune_offload` -> `prune_offloaded`).
__getattr__ = suggesting_getattr(__name__, __all__)
