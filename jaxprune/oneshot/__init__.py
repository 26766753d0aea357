"""One-shot pruning of trained models from calibration batches: magnitude, Wanda
(Sun et al. 2023) and SparseGPT (Frantar & Alistarh 2023), unstructured or N:M."""

from jaxprune.oneshot._api import METHODS, prune
from jaxprune.oneshot._layers import Layer, Site, find_layers

__all__ = ['METHODS', 'Layer', 'Site', 'find_layers', 'prune']
