"""The main job's language model: a pre-norm decoder over bytes, its layers under `nn.scan`.

Each layer is RMSNorm, causal grouped-query attention with rotary positions
(Su et al. 2021, arXiv 2104.09864; Ainslie et al. 2023, arXiv 2305.13245),
then RMSNorm and a SwiGLU MLP (Shazeer 2020, arXiv 2002.05202). The layers run
under one `nn.scan`, so each of their kernels is one leaf with a leading layer
axis, e.g. 'layers/q/kernel' of shape (num_layers, d_model, d_model), which
`layer_axes_map=('layers/.*:1',)` prunes layer by layer. Params are float32;
the matmuls run in `compute_dtype` (bfloat16 by default), the softmaxes and the
logits in float32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

VOCAB = 256  # bytes


def rotary(x: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotates `x` (batch, time, heads, head_dim) by its positions (RoPE, half-split form)."""
  half = x.shape[-1] // 2
  frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * frequencies
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], -1)
  return rotated.astype(x.dtype)


class Layer(nn.Module):
  """One pre-norm decoder layer, in `nn.scan`'s form: (carry, _) -> (carry, None)."""

  d_model: int
  num_heads: int
  num_kv_heads: int
  mlp_dim: int
  dtype: Any

  def _dense(self, features: int, name: str) -> nn.Dense:
    return nn.Dense(features, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32, name=name)

  @nn.compact
  def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
    """Maps the residual stream (batch, time, d_model) to the next layer's."""
    b, t, _ = x.shape
    head_dim = self.d_model // self.num_heads
    group = self.num_heads // self.num_kv_heads
    h = nn.RMSNorm(dtype=self.dtype, name='attn_norm')(x)
    q = self._dense(self.num_heads * head_dim, 'q')(h).reshape(b, t, self.num_heads, head_dim)
    k = self._dense(self.num_kv_heads * head_dim, 'k')(h).reshape(b, t, self.num_kv_heads, -1)
    v = self._dense(self.num_kv_heads * head_dim, 'v')(h).reshape(b, t, self.num_kv_heads, -1)
    q, k = rotary(q), rotary(k)
    # Each key/value head serves `group` query heads.
    q = q.reshape(b, t, self.num_kv_heads, group, head_dim)
    logits = jnp.einsum('btkgd,bskd->bkgts', q, k, preferred_element_type=jnp.float32)
    logits = logits / jnp.sqrt(jnp.float32(head_dim))
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, logits, jnp.finfo(jnp.float32).min), axis=-1)
    attended = jnp.einsum('bkgts,bskd->btkgd', weights.astype(self.dtype), v)
    x = x + self._dense(self.d_model, 'o')(attended.reshape(b, t, -1)).astype(x.dtype)
    h = nn.RMSNorm(dtype=self.dtype, name='mlp_norm')(x)
    gated = nn.silu(self._dense(self.mlp_dim, 'gate')(h)) * self._dense(self.mlp_dim, 'up')(h)
    return x + self._dense(self.d_model, 'down')(gated).astype(x.dtype), None


class DecoderLM(nn.Module):
  """Byte-level decoder: embedding, `num_layers` scanned layers, RMSNorm, output head.

  Attributes:
    num_layers: decoder layers (the leading axis of every 'layers/...' leaf).
    d_model: width of the residual stream.
    num_heads: query heads; `d_model` must be a multiple of it, and the head
      width even (RoPE rotates pairs).
    num_kv_heads: key/value heads, a divisor of `num_heads` (grouped-query attention).
    mlp_dim: hidden width of the SwiGLU MLP.
    compute_dtype: 'bfloat16' or 'float32': the dtype of the matmuls.
  """

  num_layers: int = 4
  d_model: int = 128
  num_heads: int = 4
  num_kv_heads: int = 2
  mlp_dim: int = 384
  compute_dtype: str = 'bfloat16'

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Maps bytes (batch, time) to next-byte logits (batch, time, 256), float32."""
    dtype = jnp.dtype(self.compute_dtype)
    tokens = tokens.astype(jnp.int32)
    x = nn.Embed(VOCAB, self.d_model, param_dtype=jnp.float32, name='embed')(tokens)
    layers = nn.scan(
      Layer,
      variable_axes={'params': 0},
      split_rngs={'params': True},
      length=self.num_layers,
    )
    x, _ = layers(
      self.d_model, self.num_heads, self.num_kv_heads, self.mlp_dim, dtype, name='layers'
    )(x, None)
    x = nn.RMSNorm(dtype=dtype, name='final_norm')(x)
    head = nn.Dense(VOCAB, use_bias=False, dtype=dtype, param_dtype=jnp.float32, name='head')
    return head(x).astype(jnp.float32)


def check_shape(config: Any) -> None:
  """Raises ValueError naming the field when the model's widths do not fit together.

  Args:
    config: the `model` block of a training config with `name='lm'`.
  """
  if config.d_model % config.num_heads:
    raise ValueError(
      f'model.d_model={config.d_model} is not a multiple of model.num_heads='
      f'{config.num_heads}; pick widths whose quotient (the head width) is an even integer.'
    )
  if (config.d_model // config.num_heads) % 2:
    raise ValueError(
      f'model.d_model={config.d_model} / model.num_heads={config.num_heads} gives an odd '
      'head width; rotary positions rotate pairs of features: make it even.'
    )
  if config.num_heads % config.num_kv_heads:
    raise ValueError(
      f'model.num_kv_heads={config.num_kv_heads} does not divide model.num_heads='
      f'{config.num_heads}; each key/value head serves the same number of query heads.'
    )
