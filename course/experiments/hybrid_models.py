"""Published hybrid models: layers of different kinds in one model, and what each kind keeps.

Chapter 10 sizes these. A hybrid model's layers fall into groups by what they keep per
request, and vLLM's hybrid KV cache manager gives each group its own block table:

    full attention     a key and a value per token, for every token so far
    sliding window     a key and a value per token, for the last ``window`` tokens only
    state              one fixed-size state per request (Mamba, linear attention), however
                       long the request

Every number is copied from the public source named beside its model, so a learner can check
it. A state layer's size is the one vLLM allocates for it (``MambaStateShapeCalculator`` in
``vllm/model_executor/layers/mamba/mamba_utils.py``, vLLM 0.34.0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course.language import tr, tr_later

FULL, SLIDING, STATE = tr_later("full attention"), tr_later("sliding window"), tr_later("state")


@dataclass(frozen=True)
class LayerGroup:
    """``num_layers`` layers of one kind and one shape.

    An attention layer (``FULL`` or ``SLIDING``) caches a key and a value of ``head_dim``
    elements per KV head and token; a sliding-window layer's query sees the last ``window``
    tokens, itself included. A ``STATE`` layer keeps ``state_elements`` elements per request
    (its convolution and recurrent states together), however many tokens it has seen.
    """

    kind: str
    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    window: int | None = None
    state_elements: int = 0

    @property
    def label(self) -> str:
        """How a table names the group, in the learner's language: its layers and kind, and a
        sliding window's length."""
        if self.kind == SLIDING:
            return tr(f"{self.num_layers} sliding window ({self.window} tokens)")
        return f"{self.num_layers} {self.kind_name}"

    @property
    def kind_name(self) -> str:
        """The group's kind, in the learner's language."""
        return tr(self.kind)


@dataclass(frozen=True)
class HybridModel:
    name: str
    groups: tuple[LayerGroup, ...]
    max_model_len: int
    source: str

    def __repr__(self) -> str:  # a hint names the model, not its every field
        return f"HybridModel({self.name!r})"

    @property
    def num_layers(self) -> int:
        return sum(group.num_layers for group in self.groups)

    def all_full_attention(self) -> HybridModel:
        """The same model with every layer a full-attention layer of its attention layers'
        shape: what a cache that knows only one kind of layer would hold for it."""
        attention = next(g for g in self.groups if g.kind == FULL)
        every = replace(attention, num_layers=self.num_layers)
        return replace(self, name=f"{self.name}, all full attention", groups=(every,))


def gated_delta_net_state_elements(num_k_heads: int, num_v_heads: int, head_k_dim: int,
                                   head_v_dim: int, conv_kernel: int) -> int:
    """Elements of one gated-DeltaNet layer's state per request, as vLLM allocates it: a
    convolution state of ``conv_kernel - 1`` positions over the layer's query, key and value
    channels, and a recurrent state of one ``head_k_dim x head_v_dim`` matrix per value
    head."""
    conv_channels = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    return (conv_kernel - 1) * conv_channels + num_v_heads * head_k_dim * head_v_dim


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


HYBRID_MODELS: dict[str, HybridModel] = {
    m.name: m
    for m in [
        # gpt-oss: layers alternate, sliding first (layer i slides when i is even)
        HybridModel("gpt-oss-120b",
                    (LayerGroup(SLIDING, 18, 8, 64, window=128), LayerGroup(FULL, 18, 8, 64)),
                    131072,
                    _hf("openai/gpt-oss-120b") + "; github.com/openai/gpt-oss "
                    "gpt_oss/torch/model.py (sliding_window if layer_idx % 2 == 0)"),
        HybridModel("gpt-oss-20b",
                    (LayerGroup(SLIDING, 12, 8, 64, window=128), LayerGroup(FULL, 12, 8, 64)),
                    131072,
                    _hf("openai/gpt-oss-20b") + "; github.com/openai/gpt-oss "
                    "gpt_oss/torch/model.py"),
        # Gemma 3: five local (sliding) layers to each global one
        HybridModel("Gemma-3-27B",
                    (LayerGroup(SLIDING, 52, 16, 128, window=1024),
                     LayerGroup(FULL, 10, 16, 128)),
                    131072,
                    _hf("google/gemma-3-27b-it") + " (text_config); github.com/google/"
                    "gemma_pytorch gemma/config.py get_config_for_27b_v3"),
        HybridModel("Gemma-3-12B",
                    (LayerGroup(SLIDING, 40, 8, 256, window=1024), LayerGroup(FULL, 8, 8, 256)),
                    131072,
                    _hf("google/gemma-3-12b-it") + " (text_config); github.com/google/"
                    "gemma_pytorch gemma/config.py get_config_for_12b"),
        # Qwen3-Next: three gated-DeltaNet (linear attention) layers to each full one
        HybridModel("Qwen3-Next-80B-A3B",
                    (LayerGroup(STATE, 36, state_elements=gated_delta_net_state_elements(
                        num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                        conv_kernel=4)),
                     LayerGroup(FULL, 12, 2, 256)),
                    262144,
                    _hf("Qwen/Qwen3-Next-80B-A3B-Instruct") + " (full_attention_interval 4); "
                    "state: vLLM MambaStateShapeCalculator.gated_delta_net_state_shape"),
    ]
}
