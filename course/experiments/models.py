"""Published model configurations and GPU capacities that the course computes with.

Every number here is copied from a public source named beside it, so a learner can check it.
The KV cache depends only on the attention shape: layers, KV heads and head size (or, for
multi-head latent attention, the latent and RoPE widths). Parameter counts are here to size
the weights that share the GPU with the cache.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, repr=False)
class ModelConfig:
    """The attention shape of a decoder-only transformer.

    ``num_kv_heads`` is what the KV cache stores per layer:
    MHA has ``num_kv_heads == num_attention_heads``, GQA has fewer (each KV head serves a group
    of query heads) and MQA has one. An MLA model (``kv_lora_rank`` set) caches one compressed
    latent vector of ``kv_lora_rank`` values plus a decoupled RoPE key of ``qk_rope_head_dim``
    values per token and layer, shared by all heads, instead of per-head keys and values.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float  # published parameter count, for the weights' footprint
    source: str
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    def __repr__(self) -> str:
        shape = f"layers={self.num_layers}, heads={self.num_attention_heads}, " + (
            f"kv_lora_rank={self.kv_lora_rank}, qk_rope_head_dim={self.qk_rope_head_dim}"
            if self.kv_lora_rank is not None
            else f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
        )
        return f"<{self.name}: {self.attention}, {shape}>"

    @property
    def attention(self) -> str:
        """``"MLA"``, ``"MHA"``, ``"MQA"`` or ``"GQA"``."""
        if self.kv_lora_rank is not None:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def weight_bytes(self, bytes_per_param: float = 2) -> int:
        """Bytes of the weights at ``bytes_per_param`` (2 for fp16 / bf16)."""
        return int(self.num_params * bytes_per_param)


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in [
        ModelConfig("OPT-13B", 40, 40, 40, 128, 13e9,
                    _hf("facebook/opt-13b") + "; parameters: Zhang et al. 2022, OPT, Table 1"),
        ModelConfig("Llama-2-7B", 32, 32, 32, 128, 6.74e9,
                    _hf("meta-llama/Llama-2-7b-hf") + "; parameters: its Hugging Face page"),
        ModelConfig("Llama-2-70B", 80, 64, 8, 128, 68.98e9,
                    _hf("meta-llama/Llama-2-70b-hf") + "; parameters: its Hugging Face page"),
        ModelConfig("Llama-3-8B", 32, 32, 8, 128, 8.03e9,
                    _hf("meta-llama/Meta-Llama-3-8B") + "; parameters: its Hugging Face page"),
        ModelConfig("Mistral-7B", 32, 32, 8, 128, 7.24e9,
                    _hf("mistralai/Mistral-7B-v0.1") + "; parameters: its Hugging Face page"),
        ModelConfig("Qwen2.5-7B", 28, 28, 4, 128, 7.61e9,
                    _hf("Qwen/Qwen2.5-7B") + "; parameters: Qwen2.5 technical report, Table 1"),
        ModelConfig("Falcon-7B", 32, 71, 1, 64, 7.22e9,
                    _hf("tiiuae/falcon-7b") + " (multi_query: true); parameters: its model card"),
        ModelConfig("DeepSeek-V2", 60, 128, 128, 128, 236e9,
                    _hf("deepseek-ai/DeepSeek-V2") + "; parameters: DeepSeek-AI 2024, DeepSeek-V2",
                    kv_lora_rank=512, qk_rope_head_dim=64),
        # Chapter 13's large models: two MLA models and two GQA models of similar size. For MLA
        # models ``num_kv_heads`` and ``head_dim`` are, as for DeepSeek-V2, the config's
        # num_key_value_heads and qk_nope_head_dim (= v_head_dim): the per-head K and V the
        # latent is expanded to, which the cache does not store.
        ModelConfig("DeepSeek-V3", 61, 128, 128, 128, 671e9,
                    _hf("deepseek-ai/DeepSeek-V3") + " (qk_nope_head_dim 128, v_head_dim 128); "
                    "parameters: DeepSeek-AI 2024, DeepSeek-V3 Technical Report (671B total, "
                    "37B activated)",
                    kv_lora_rank=512, qk_rope_head_dim=64),
        ModelConfig("Kimi-K2", 61, 64, 64, 128, 1.04e12,
                    _hf("moonshotai/Kimi-K2-Instruct") + " (qk_nope_head_dim 128, v_head_dim "
                    "128); parameters: Kimi K2 technical report, 1.04T total (its model card "
                    "rounds to 1T total, 32B activated)",
                    kv_lora_rank=512, qk_rope_head_dim=64),
        ModelConfig("Qwen3-235B-A22B", 94, 64, 4, 128, 235e9,
                    _hf("Qwen/Qwen3-235B-A22B") + "; parameters: its model card (235B total, "
                    "22B activated)"),
        ModelConfig("Llama-3.1-405B", 126, 128, 8, 128, 405e9,
                    _hf("meta-llama/Llama-3.1-405B") + " (head_dim: hidden_size 16384 / 128 "
                    "heads); parameters: its model card"),
    ]
}


@dataclass(frozen=True)
class GPU:
    """A GPU's memory capacity as its datasheet prints it, in GB (10**9 bytes).

    The driver reports a slightly different usable figure (an "80 GB" A100 holds 80 GiB);
    the course uses the datasheet number and says so.
    """

    name: str
    memory_gb: float
    source: str


GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("L4 (24 GB)", 24, "NVIDIA L4 datasheet"),
        GPU("A100 (40 GB)", 40, "NVIDIA A100 datasheet"),
        GPU("A100 / H100 (80 GB)", 80, "NVIDIA A100 and H100 datasheets"),
        GPU("H200 (141 GB)", 141, "NVIDIA H200 datasheet"),
    ]
}
