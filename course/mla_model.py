"""Chapter 13's model: a tiny decoder with multi-head latent attention (MLA, DeepSeek-V2 and
V3), and plain greedy generation that computes every head's full keys and values, the
baseline the latent cache must reproduce token for token.

An MLA layer does not cache per-head keys and values. It projects the token down to one
latent vector ``c`` (``kv_lora_rank`` values, RMS-normalised) and one rotary key ``k_pe``
(``rope_dim`` values) shared by all heads, and caches only those; a head's key and value are
projections of the latent back up::

    c     = norm(x W_dkv)              [rank]          cached
    k_pe  = rope(x W_kr)               [rope]          cached, one for all heads
    k_h   = [c W_uk_h ; k_pe]          [nope + rope]   head h's key
    v_h   = c W_uv_h                   [v_dim]         head h's value
    q_h   = [q_nope_h ; rope(q_pe_h)]  [nope + rope]

so ``q_h . k_h = (q_nope_h W_uk_h^T) . c + q_pe_h . k_pe``: the key's up-projection can be
moved onto the query (absorbed), and attention then reads the latent record ``[c ; k_pe]``
itself, one "KV head" of ``rank + rope`` values for every query head; the value's
up-projection comes after the weighted sum of latents. ``course.v1.mla_engine`` serves the
model that way; ``generate_full_kv`` here computes the keys and values the long way.

Weights are random from a fixed seed, as chapter 8's model's (``course.tiny_model``), whose
norm, rotary embedding, MLP, embedding and logits this model shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course.tiny_model import TinyModel, _rms_norm, causal_attention, rope


@dataclass(frozen=True)
class MLAConfig:
    vocab_size: int = 128
    hidden: int = 64
    num_layers: int = 2
    num_heads: int = 4
    kv_lora_rank: int = 32  # DeepSeek-V3: 512
    qk_nope_head_dim: int = 16  # 128
    qk_rope_head_dim: int = 8  # 64
    v_head_dim: int = 16  # 128
    mlp_hidden: int = 128
    rope_theta: float = 10000.0

    @property
    def record_dim(self) -> int:
        """Values cached per token per layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def window(self, layer: int) -> None:
        """Every layer attends to all its keys (the engine asks, as of chapter 10's models)."""
        return None


class TinyMLAModel:
    """Random weights from ``seed``, float32 on the CPU unless told otherwise. ``w_uk``
    [heads, nope, rank] and ``w_uv`` [heads, v_dim, rank] are the up-projections, per head
    (DeepSeek's ``kv_b_proj`` split in two)."""

    def __init__(self, config: MLAConfig = MLAConfig(), seed: int = 0,
                 device: str = "cpu") -> None:
        self.config = c = config
        gen = torch.Generator().manual_seed(seed)

        def weight(*shape: int, gain: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * gain / math.sqrt(shape[-1])).to(device)

        qk_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
        self.embedding = torch.randn(c.vocab_size, c.hidden, generator=gen).to(device)
        self.layers = [{
            "wq": weight(c.num_heads * qk_dim, c.hidden),
            "w_dkv": weight(c.kv_lora_rank, c.hidden),
            "w_kr": weight(c.qk_rope_head_dim, c.hidden),
            "w_uk": weight(c.num_heads, c.qk_nope_head_dim, c.kv_lora_rank),
            "w_uv": weight(c.num_heads, c.v_head_dim, c.kv_lora_rank),
            "wo": weight(c.hidden, c.num_heads * c.v_head_dim),
            "w_gate": weight(c.mlp_hidden, c.hidden),
            "w_up": weight(c.mlp_hidden, c.hidden),
            "w_down": weight(c.hidden, c.mlp_hidden),
        } for _ in range(c.num_layers)]
        self.lm_head = weight(c.vocab_size, c.hidden, gain=4.0)
        self.scale = 1 / math.sqrt(qk_dim)  # a head's query and key have nope + rope values

    # the token embedding, the rest of a layer after attention, the logits: chapter 8's model's
    embed = TinyModel.embed
    finish_layer = TinyModel.finish_layer
    logits = TinyModel.logits

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a layer computes before attention for ``x`` [n, hidden] at ``positions``: the
        queries [n, heads, nope + rope] (the rope part rotated), the latents [n, rank] and
        the rotary keys [n, rope] (rotated), the last two what the cache keeps."""
        c, w = self.config, self.layers[layer]
        h = _rms_norm(x)
        q = (h @ w["wq"].T).view(-1, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent = _rms_norm(h @ w["w_dkv"].T)
        k_pe = rope((h @ w["w_kr"].T)[:, None, :], positions, c.rope_theta)[:, 0]
        return torch.cat([q_nope, rope(q_pe, positions, c.rope_theta)], dim=-1), latent, k_pe

    def full_kv(self, layer: int, latent: torch.Tensor, k_pe: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's keys [t, heads, nope + rope] and values [t, heads, v_dim] from the
        cached latents [t, rank] and rotary keys [t, rope]: the up-projections, done."""
        w = self.layers[layer]
        k_nope = torch.einsum("tr,hdr->thd", latent, w["w_uk"])
        k_rope = k_pe[:, None, :].expand(-1, self.config.num_heads, -1)
        return torch.cat([k_nope, k_rope], dim=-1), torch.einsum("tr,hvr->thv", latent,
                                                                  w["w_uv"])


def generate_full_kv(model: TinyMLAModel, prompt: list[int], max_new_tokens: int
                     ) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy generation that keeps every layer's latents and rotary keys contiguous and,
    at every step, computes all heads' full keys and values from them (no absorption, no
    paging): the new tokens and the logits each was chosen from."""
    c, device = model.config, model.embedding.device
    latents = [torch.empty(0, c.kv_lora_rank, device=device) for _ in range(c.num_layers)]
    rotary = [torch.empty(0, c.qk_rope_head_dim, device=device) for _ in range(c.num_layers)]
    tokens, all_logits = list(prompt), []
    new = torch.tensor(prompt, device=device)
    while len(all_logits) < max_new_tokens:
        past = len(tokens) - len(new)
        x = model.embed(new)
        for layer in range(c.num_layers):
            q, latent, k_pe = model.qkv(layer, x, torch.arange(past, len(tokens),
                                                               device=device))
            latents[layer] = torch.cat([latents[layer], latent])
            rotary[layer] = torch.cat([rotary[layer], k_pe])
            keys, values = model.full_kv(layer, latents[layer], rotary[layer])
            x = model.finish_layer(layer, x, causal_attention(q, keys, values, model.scale,
                                                               past))
        logits = model.logits(x[-1:])[0]
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        new = torch.tensor([tokens[-1]], device=device)
    return tokens[len(prompt):], all_logits

