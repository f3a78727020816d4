"""Chapter 8's model: a tiny decoder-only transformer, and plain greedy generation with a
contiguous KV cache, the baseline the paged engine must reproduce token for token.

Llama-shaped and small enough for a CPU: RMSNorm, grouped-query attention (4 query heads
over 2 KV heads by default) with rotary position embeddings, a SwiGLU MLP. Weights are
random, drawn from a fixed seed (no download); their scale is chosen so that the logits are
spread over several units, which keeps greedy choices far from ties.

The model is a set of plain functions of one layer at a time, so an engine can put its own
KV cache between ``qkv`` (queries, keys and values of new tokens) and ``finish_layer`` (the
rest of the layer, given the attention output)::

    x = embed(tokens)
    for layer:  q, k, v = qkv(layer, x, positions)     # K/V go to the cache here
                out = attention(q, cached K/V)          # contiguous or paged
                x = finish_layer(layer, x, out)
    logits(x)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 128
    hidden: int = 64
    num_layers: int = 2
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    mlp_hidden: int = 128
    rope_theta: float = 10000.0
    # per layer, the keys a query sees (itself included) for a sliding-window layer, or None
    # for full attention (chapter 10's hybrid models); None: every layer full attention
    windows: tuple[int | None, ...] | None = None

    def window(self, layer: int) -> int | None:
        return None if self.windows is None else self.windows[layer]


class TinyModel:
    """Random weights from ``seed``; float32 on the CPU unless told otherwise."""

    def __init__(self, config: TinyConfig = TinyConfig(), seed: int = 0,
                 device: str = "cpu") -> None:
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        c = config

        def weight(rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=gen) * gain / math.sqrt(cols)).to(device)

        self.embedding = torch.randn(c.vocab_size, c.hidden, generator=gen).to(device)
        self.layers = [{
            "wq": weight(c.num_q_heads * c.head_dim, c.hidden),
            "wk": weight(c.num_kv_heads * c.head_dim, c.hidden),
            "wv": weight(c.num_kv_heads * c.head_dim, c.hidden),
            "wo": weight(c.hidden, c.num_q_heads * c.head_dim),
            "w_gate": weight(c.mlp_hidden, c.hidden),
            "w_up": weight(c.mlp_hidden, c.hidden),
            "w_down": weight(c.hidden, c.mlp_hidden),
        } for _ in range(c.num_layers)]
        self.lm_head = weight(c.vocab_size, c.hidden, gain=4.0)
        self.scale = 1 / math.sqrt(c.head_dim)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[n] token ids -> [n, hidden]."""
        return self.embedding[tokens.long()]

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [n, q_heads, dim], keys and values [n, kv_heads, dim] of ``x`` [n, hidden]
        at ``positions`` [n] (RoPE rotates q and k by their position)."""
        c, w = self.config, self.layers[layer]
        h = _rms_norm(x)
        q = (h @ w["wq"].T).view(-1, c.num_q_heads, c.head_dim)
        k = (h @ w["wk"].T).view(-1, c.num_kv_heads, c.head_dim)
        v = (h @ w["wv"].T).view(-1, c.num_kv_heads, c.head_dim)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def finish_layer(self, layer: int, x: torch.Tensor, attention: torch.Tensor
                     ) -> torch.Tensor:
        """The residual stream after the layer, given its attention output [n, q_heads, dim]."""
        w = self.layers[layer]
        x = x + attention.flatten(1) @ w["wo"].T
        h = _rms_norm(x)
        gated = torch.nn.functional.silu(h @ w["w_gate"].T) * (h @ w["w_up"].T)
        return x + gated @ w["w_down"].T

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x) @ self.lm_head.T


def _rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate each head's pairs (first half, second half) of ``x`` [n, heads, dim] by angles
    position x theta^(-2i/dim)."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = positions.to(torch.float64)[:, None] * frequencies[None, :]
    cos, sin = angles.cos().to(x.dtype)[:, None, :], angles.sin().to(x.dtype)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     past: int = 0, window: int | None = None) -> torch.Tensor:
    """Attention of ``q`` [n, q_heads, dim] over ``k``, ``v`` [past + n, kv_heads, dim]: query
    i sees keys 0 .. past + i, or with a ``window`` the last ``window`` of them (grouped-query
    heads expanded)."""
    group = q.shape[1] // k.shape[1]
    keys = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, t, dim]
    values = v.repeat_interleave(group, dim=1).transpose(0, 1)
    visible = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril(past)
    if window is not None:
        visible = visible.triu(past - window + 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=visible, scale=scale)
    return out.transpose(0, 1)


def generate_contiguous(model: TinyModel, prompt: list[int], max_new_tokens: int,
                        first_token: int | None = None
                        ) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy generation with a contiguous KV cache per layer: the new tokens, and the logits
    each was chosen from. ``first_token`` overrides the first choice (a parallel-sampling
    branch that took another token there)."""
    c, device = model.config, model.embedding.device
    keys = [torch.empty(0, c.num_kv_heads, c.head_dim, device=device)
            for _ in range(c.num_layers)]
    values = [torch.empty(0, c.num_kv_heads, c.head_dim, device=device)
              for _ in range(c.num_layers)]
    tokens, all_logits = list(prompt), []
    new = torch.tensor(prompt, device=device)
    while len(all_logits) < max_new_tokens:
        past = len(tokens) - len(new)
        positions = torch.arange(past, len(tokens), device=device)
        x = model.embed(new)
        for layer in range(c.num_layers):
            q, k, v = model.qkv(layer, x, positions)
            keys[layer] = torch.cat([keys[layer], k])
            values[layer] = torch.cat([values[layer], v])
            x = model.finish_layer(layer, x, causal_attention(q, keys[layer], values[layer],
                                                               model.scale, past,
                                                               c.window(layer)))
        logits = model.logits(x[-1:])[0]
        choice = int(logits.argmax())
        if first_token is not None and not all_logits:
            choice = first_token
        all_logits.append(logits)
        tokens.append(choice)
        new = torch.tensor([choice], device=device)
    return tokens[len(prompt):], all_logits
