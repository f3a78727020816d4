"""Chapter 11: load a prefix's KV from the CPU tier, or compute it again?

Loading ``n`` tokens moves their KV over the host link; computing them again is a prefill of
``n`` tokens, whose attention grows with ``n`` squared::

    load       n x kv_bytes_per_token / link bandwidth  +  blocks x per-block overhead
    recompute  (2 x params x n  +  4 x layers x heads x head_dim x n(n+1)/2) / (peak x utilisation)
                weights' matmuls   attention's QK^T and PV over a causal prefix

The FLOP counts are the usual forward-pass estimates (2 FLOPs per parameter per token; QK^T and PV
each 2 x head_dim FLOPs per query-key pair and head, over the n(n+1)/2 causal pairs). The GPU's
figures are chapter 5's (``course.experiments.serving_sim.CostModel``: an A100's 312 TFLOP/s of fp16
at 50% utilisation, PCIe at 25 GB/s, 20 µs per block moved).
"""

from __future__ import annotations

from dataclasses import dataclass

from course.experiments.kv_sizing import kv_bytes_per_token
from course.experiments.models import MODELS, ModelConfig
from course.experiments.serving_sim import CostModel
from course.language import tr

# PCIe 5.0 x16: 32 GT/s per lane with 128b/130b encoding, about 63 GB/s each way (PCI-SIG,
# PCI Express Base Specification 5.0); chapter 5's 25 GB/s is what a PCIe 4.0 x16 link
# sustains in practice.
PCIE5_BYTES_PER_S = 32e9 * 16 * 128 / 130 / 8


@dataclass(frozen=True)
class TransferCost:
    """The time to have a prefix's KV in the GPU pool, loaded or computed again."""

    model: ModelConfig
    link_bytes_per_s: float
    peak_flops: float = CostModel.peak_flops
    flops_utilisation: float = CostModel.flops_utilisation
    block_overhead_s: float = CostModel.swap_block_overhead_s
    bytes_per_element: int = 2

    def load_seconds(self, num_tokens: int, block_size: int = 16) -> float:
        _positive(num_tokens)
        per_token = kv_bytes_per_token(self.model.num_layers, self.model.num_kv_heads,
                                       self.model.head_dim, self.bytes_per_element)
        blocks = -(-num_tokens // block_size)
        return num_tokens * per_token / self.link_bytes_per_s + blocks * self.block_overhead_s

    def recompute_seconds(self, num_tokens: int) -> float:
        _positive(num_tokens)
        m = self.model
        matmuls = 2 * m.num_params * num_tokens
        attention = 4 * m.num_layers * m.num_attention_heads * m.head_dim * \
            num_tokens * (num_tokens + 1) / 2
        return (matmuls + attention) / (self.peak_flops * self.flops_utilisation)

    def should_load(self, num_tokens: int, block_size: int = 16) -> bool:
        """Load when it is strictly faster than computing again."""
        return self.load_seconds(num_tokens, block_size) < self.recompute_seconds(num_tokens)

    def faster(self, num_tokens: int, block_size: int = 16) -> str:
        """The faster way to a prefix of ``num_tokens`` tokens, in the learner's language."""
        return tr("load") if self.should_load(num_tokens, block_size) else tr("compute again")


def _positive(num_tokens: int) -> None:
    if num_tokens < 1:
        raise ValueError(f"a prefix has at least one token, got {num_tokens}")


def speedup_series(lengths: list[int], block_size: int = 16) -> dict[str, list[float]]:
    """Recompute time over load time at each length, for OPT-13B (MHA) and Llama-3-8B (GQA:
    a quarter of the KV bytes) over chapter 5's link and PCIe 5.0: above 1, loading wins."""
    series = {}
    for name in ("OPT-13B", "Llama-3-8B"):
        for link, rate in (("25 GB/s", CostModel.pcie_bytes_per_s),
                           ("PCIe 5.0", PCIE5_BYTES_PER_S)):
            cost = TransferCost(MODELS[name], rate)
            series[f"{name}, {link}"] = [cost.recompute_seconds(n) /
                                         cost.load_seconds(n, block_size) for n in lengths]
    return series


def speedup_chart(lengths: list[int], block_size: int = 16):
    """``speedup_series`` as lines over the prefix length (log scale)."""
    from course.notebook.charts import lines_chart

    return lines_chart(lengths, speedup_series(lengths, block_size),
                       title="Computing a prefix again / loading it from the CPU tier",
                       x_title="prefix tokens", y_title="recompute time / load time",
                       log_x=True)


def main(lengths: tuple[int, ...] = (16, 128, 1024, 8192, 32768)) -> None:
    """How many times faster loading is than computing again, at each prefix length."""
    print("prefix tokens: " + ", ".join(str(n) for n in lengths))
    for label, ratios in speedup_series(list(lengths)).items():
        print(f"{label}: " + ", ".join(f"{r:.1f}x" for r in ratios))


if __name__ == "__main__":
    main()
