"""Third-party models where group identity matters: per-layer head masks, plans
carried to another trace, other sequence lengths, train-only state."""

import functools
import warnings

import jax
import numpy as np
import pytest
import thirdparty_zoo as zoo
import thirdparty_zoo_hf as hf

import jaxprune.structured as jps

EXACT = jps.Constraint(round_to=1)


def _trace(fn, variables, *args, **kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    return jps.trace(fn, variables, *args, **kwargs)


@functools.cache
def _bert():
  case = hf.hf_bert()
  return case, _trace(case.fn, case.variables, *case.inputs(2))


def _heads_groups(graph, layer):
  """Groups of 4 channels that own 8 positions each (one head) of a layer's query kernel."""
  query = f'bert/encoder/layer/{layer}/attention/self/query/kernel'
  return [
    g
    for g in graph.prunable_groups
    if g.size == 4
    and any(m.leaf == query and m.axis == 1 and m.indices.shape == (4, 8) for m in g.members)
  ]


def test_bert_has_one_heads_group_per_layer():
  # transformers' __call__ passes head_mask = ones((2 layers, 4 heads)) and each
  # layer multiplies its attention by its own row: the layers' heads stay apart.
  _, graph = _bert()
  for layer in (0, 1):
    groups = _heads_groups(graph, layer)
    assert len(groups) == 1, graph.summary()
    other = f'bert/encoder/layer/{1 - layer}/'
    assert not any(m.leaf.startswith(other) for m in groups[0].members)
    # query, key, value kernels and biases, and the output kernel's rows.
    leaves = {'/'.join(m.leaf.split('/')[-2:]) for m in groups[0].members}
    assert {'query/kernel', 'key/kernel', 'value/kernel', 'dense/kernel'} <= leaves


@pytest.mark.slow
def test_a_head_of_one_layer_goes_alone():
  case, graph = _bert()
  heads = _heads_groups(graph, 1)[0]
  plan = jps.make_plan(graph, {heads.id: [2]})
  new_params, pruned_fn = jps.apply_plan(graph, case.variables, plan)
  layers = new_params['bert']['encoder']['layer']
  assert layers['0']['attention']['self']['query']['kernel'].shape == (32, 32)
  assert layers['1']['attention']['self']['query']['kernel'].shape == (32, 24)
  assert jps.verify(graph, case.variables, plan, *case.inputs(2))


@pytest.mark.slow
@pytest.mark.parametrize(
  'builder', [hf.hf_bert, zoo.haiku_resnet18], ids=['hf_bert', 'haiku_resnet18']
)
def test_a_plan_applies_to_a_trace_at_another_batch(builder):
  case = builder()
  graph = _trace(case.fn, case.variables, *case.inputs(2))
  other = _trace(case.fn, case.variables, *case.inputs(1))
  plan = jps.select(graph, case.variables, ratio=0.3, scope='global', constraint=EXACT)
  expected, _ = jps.apply_plan(graph, case.variables, plan)
  carried, pruned_fn = jps.apply_plan(other, case.variables, plan)
  jax.tree.map(np.testing.assert_array_equal, carried, expected)
  # the same plan made on the other trace removes the same channels.
  again, _ = jps.apply_plan(
    other,
    case.variables,
    jps.select(other, case.variables, ratio=0.3, scope='global', constraint=EXACT),
  )
  jax.tree.map(np.testing.assert_array_equal, again, expected)


@pytest.mark.slow
@pytest.mark.parametrize(
  'builder', [hf.hf_bert, hf.hf_gpt2, hf.hf_llama], ids=['hf_bert', 'hf_gpt2', 'hf_llama']
)
def test_text_models_run_at_another_sequence_length(builder):
  case = builder()
  graph = _trace(case.fn, case.variables, *case.inputs(2))
  plan = jps.select(graph, case.variables, ratio=0.3, scope='global', constraint=EXACT)
  new_params, pruned_fn = jps.apply_plan(graph, case.variables, plan)
  ids = zoo.token_ids(2, 13, hf.VOCAB, seed=3)  # traced with 8 tokens
  out = pruned_fn(new_params, ids)
  ref = jax.jit(case.fn)(jps.zero_removed(graph, case.variables, plan), ids)
  assert out.shape == ref.shape
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.slow
def test_haiku_eval_and_train_entry_points_in_one_graph():
  # The BatchNorm EMA `hidden` is read only in train mode: traced with both
  # entry points, it follows its channels, and the pruned variables serve both.
  eval_case, train_case = zoo.haiku_resnet18(), zoo.haiku_resnet18(train=True, image=32)
  variables, x = eval_case.variables, eval_case.inputs(2)[0]
  graph = _trace(eval_case.fn, variables, x, also=[(train_case.fn, (x,))])
  assert len(graph.prunable_groups) == 12, graph.summary()
  assert not [name for name in graph.unread if name.endswith('/hidden')]
  plan = jps.select(graph, variables, ratio=0.3, scope='global', constraint=EXACT)
  new_variables, eval_fn = jps.apply_plan(graph, variables, plan)
  train_fn = jps.pruned_callable(graph, plan, entry=1)
  state = new_variables['state']
  for name, ema in state.items():
    if name.endswith('mean_ema'):
      assert ema['hidden'].shape == ema['average'].shape, name
  logits = eval_fn(new_variables, x[:1])
  assert logits.shape == (1, 10)
  train_logits, new_state = train_fn(new_variables, x)
  assert jax.tree.map(np.shape, new_state) == jax.tree.map(np.shape, {'state': state})
  assert jps.verify(graph, variables, plan, x)
