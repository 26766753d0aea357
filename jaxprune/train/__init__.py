"""The main job: train and prune a Flax model from a config (`jaxprune-train`).

Needs the `examples` extra (scikit-learn, absl-py, tqdm, orbax-checkpoint,
matplotlib; tensorboardX is optional).
"""

from jaxprune.train._data import Dataset, load_digits, load_npz
from jaxprune.train._defaults import get_config, pruning_config
from jaxprune.train._loop import TrainResult, train
from jaxprune.train._models import CNN, MLP
from jaxprune.train._report import format_report
from jaxprune.train._step import TrainState, make_optimizer, make_train_step

__all__ = [
    'CNN', 'MLP', 'Dataset', 'TrainResult', 'TrainState', 'format_report', 'get_config',
    'load_digits', 'load_npz', 'make_optimizer', 'make_train_step', 'pruning_config', 'train',
]
