"""`oneshot.prune` against the authors' own code (Wanda, SparseGPT, OWL, RIA; PyTorch on
CPU) on the same weights and calibration tokens, layer by layer: `benchmarks/
reference_parity.py` runs both sides; this file asserts what each comparison must give.

It needs torch and checkouts of the authors' repositories in the folder named by
`JAXPRUNE_REFERENCES` (how to get them: benchmarks/reference_parity.py), and is skipped,
with the reason, without them (CI has neither). The expected numbers come from the
authors' code: equal masks, and where their count differs, the difference their threshold
makes (it prunes the scores `<=` the (k+1)-th smallest of a layer or SparseGPT block:
`int(s * size) + 1` weights, one more than `oneshot.prune`'s `round(s * size)`).
"""

import warnings

import pytest

pytest.importorskip('torch', reason="torch is not installed: the comparison runs the authors' code")

from benchmarks import reference_parity  # noqa: E402

_REASON = reference_parity.missing()
pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(_REASON is not None, reason=str(_REASON)),
  pytest.mark.filterwarnings('ignore'),  # the authors' code and transformers' deprecations
]
LAYERS = 2 * 7  # two blocks of q, k, v, o, gate, up, down


def _by_setting(rows):
  return {row.setting: row for row in rows}


def test_magnitude_equals_wandas_prune_magnitude():
  rows = _by_setting(reference_parity.magnitude(sparsity=0.5))
  # Their threshold prunes one more weight per layer; asked for that count, the same masks.
  assert rows['50%'].mask_differences == LAYERS
  assert rows['50%, count k+1'].mask_differences == 0
  assert rows['50%, count k+1'].max_weight_difference == 0
  (nm,) = reference_parity.magnitude(nm='2:4')
  assert (nm.mask_differences, nm.max_weight_difference) == (0, 0)


@pytest.mark.parametrize('target', [dict(sparsity=0.5), dict(nm='2:4')])
def test_wanda_equals_prune_wanda_block_by_block(target):
  rows = reference_parity.wanda(**target)
  blockwise = rows[0]
  assert blockwise.layers == LAYERS
  assert (blockwise.mask_differences, blockwise.max_weight_difference) == (0, 0)
  # One call measures each layer after the pruned layers before it in its block too.
  assert rows[1].mask_differences > 0


def test_sparsegpt_class_unstructured_with_its_count():
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    default, matched = reference_parity.sparsegpt_layer(sparsity=0.5, blocksize=32)
  assert default.mask_differences == 2  # one more pruned in each of the two blocks
  assert matched.mask_differences == 0
  assert matched.max_weight_difference < 1e-5


def test_sparsegpt_class_two_four():
  (row,) = reference_parity.sparsegpt_layer(nm='2:4', blocksize=32)
  assert row.mask_differences == 0
  assert row.max_weight_difference < 1e-5


@pytest.mark.parametrize('target', [dict(sparsity=0.5), dict(nm='2:4')])
def test_sparsegpt_equals_wandas_prune_sparsegpt(target):
  (row,) = reference_parity.sparsegpt_model(**target)
  assert row.layers == LAYERS
  assert row.mask_differences == 0
  assert row.max_weight_difference < 1e-4


def test_ria_equals_prune_ria():
  rows = _by_setting(reference_parity.ria(sparsity=0.5))
  # At least their extra weight in each layer (more where block 0's extra one changes the
  # inputs of block 1); asked for their count, the same masks.
  assert rows['50%'].mask_differences >= LAYERS
  assert rows['50%, count k+1'].mask_differences == 0
  for target in (dict(sparsity=0.5, per_row=True), dict(nm='2:4')):
    (row,) = reference_parity.ria(**target)
    assert (row.mask_differences, row.max_weight_difference) == (0, 0), row


def test_owl_ratios_sparsities_and_masks_equal_prune_wanda_outlier():
  parity = reference_parity.owl(0.5)
  assert parity.ratios == pytest.approx(parity.reference_ratios, abs=1e-9)
  assert parity.sparsities == pytest.approx(parity.reference_sparsities, abs=1e-12)
  assert parity.reference_sparsities[0] != parity.reference_sparsities[1]  # OWL spread them
  assert parity.row.mask_differences == 0


@pytest.mark.parametrize('target', [dict(sparsity=0.5), dict(nm='2:4')])
def test_sparsegpt_equals_the_sparsegpt_repositorys_llama_loop(target):
  # --true-sequential is oneshot.prune's default (sequential=True) in one call; without it,
  # the loop prunes block by block.
  rows = reference_parity.sparsegpt_sequential(**target)
  assert [row.layers for row in rows] == [LAYERS, LAYERS]
  for row in rows:
    assert row.mask_differences == 0, row
    assert row.max_weight_difference < 1e-4, row


def test_permute_keeps_at_least_the_score_rias_reallocation_keeps():
  # permute= starts from RIA's heuristic order (or the identity, when that keeps more) and
  # only takes swaps that keep more, so on block 0 (the same inputs on both sides) its gain
  # is at least the heuristic's.
  first, second = reference_parity.ria_reallocation('2:4')
  assert first.layer == 'layers_0/down_proj'
  assert first.reference_gain > 1
  assert first.gain >= first.reference_gain - 1e-6
  assert second.gain > 1
