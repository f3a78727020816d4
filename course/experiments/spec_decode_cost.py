"""What speculative decoding buys, and where it stops paying: ``python -m
course.experiments.spec_decode_cost``.

A verification step runs each request's newest token and its ``k`` drafts through the target
model at once. With each draft accepted with probability ``alpha``, independently (the
assumption of Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", section 3.1), a step emits on average

    E(alpha, k) = (1 - alpha^(k + 1)) / (1 - alpha)          (their equation 1)

tokens: the accepted drafts, then one of the target's own.

What the step costs is a roofline over chapter 5's cost model (``serving_sim``): it reads the
weights and every request's KV once, however many tokens it verifies, and computes 2 x
parameters FLOPs per token verified::

    step(batch, context, k) = overhead + max(memory, compute)
        memory  = (weights + batch x context x KV bytes per token) / HBM bandwidth
        compute = batch x (k + 1) x 2 x parameters / (peak FLOP/s x utilisation)

A plain decode step (k = 0) is memory-bound: verifying drafts is nearly free while the batch
is small, and costs ``k + 1`` tokens of compute for ``E`` tokens once the batch fills the GPU's
FLOPs. Where that happens depends on how much KV each request reads: OPT-13B's 800 KiB a token
(no grouped-query attention) keeps a 40 GB A100 memory-bound at any batch its pool holds,
Llama-3-8B's 128 KiB a token on an 80 GB H100 reaches the FLOPs' roof. Prompt lookup proposes
at no model cost; a draft model's steps would add to the step's time.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.experiments.kv_sizing import kv_bytes_per_token, num_gpu_blocks
from course.experiments.models import MODELS
from course.experiments.serving_sim import CostModel, opt13b_a100_40gb
from course.language import tr_later


def llama3_8b_h100() -> CostModel:
    """Llama-3-8B in bf16 on an H100 SXM 80 GB: 3.35 TB/s of HBM3 and 989 TFLOP/s of dense
    bf16 (NVIDIA's H100 datasheet); utilisation and overheads as chapter 5's."""
    model = MODELS["Llama-3-8B"]
    return CostModel(tr_later("Llama-3-8B (bf16) on an H100 80 GB"), model.num_params,
                     model.weight_bytes(2),
                     kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, 2),
                     hbm_bytes_per_s=3.35e12, peak_flops=989e12)


ACTIVATION_PEAK = 2 * 2**30  # chapter 1's assumed activation peak
BLOCK_SIZE = 16


def largest_batch(cost: CostModel, memory_bytes: float, context: int) -> int:
    """The most requests of ``context`` tokens a GPU of ``memory_bytes`` holds at once:
    chapter 1's pool (``num_gpu_blocks`` at vLLM's default 0.9 of the memory, blocks of 16),
    each request its blocks."""
    blocks = num_gpu_blocks(int(memory_bytes), 0.9, int(cost.weight_bytes), ACTIVATION_PEAK,
                            int(BLOCK_SIZE * cost.kv_bytes_per_token))
    return blocks // -(-context // BLOCK_SIZE)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verification step emits on average: ``k`` drafts each accepted with
    probability ``alpha`` until the first rejection, then one of the target's own."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ValueError(f"an acceptance rate in [0, 1] and k >= 0, got {alpha} and {k}")
    if alpha == 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def step_time(cost: CostModel, batch: int, context: int, k: int) -> float:
    """Seconds for one step that verifies ``k`` drafts for each of ``batch`` requests of
    ``context`` tokens (``k = 0``: a plain decode step)."""
    memory = (cost.weight_bytes + batch * context * cost.kv_bytes_per_token) \
        / cost.hbm_bytes_per_s
    compute = batch * (k + 1) * 2 * cost.params / (cost.peak_flops * cost.flops_utilisation)
    return cost.step_overhead_s + max(memory, compute)


@dataclass(frozen=True)
class Speculation:
    """One setting's figures against plain decoding of the same batch."""

    alpha: float
    k: int
    batch: int
    tokens_per_step: float  # per request
    speedup: float  # tokens per second per request, against k = 0
    kv_read_per_token: float  # bytes of the request's KV read per token it emits


def speculation(cost: CostModel, alpha: float, k: int, batch: int, context: int
                ) -> Speculation:
    tokens = expected_tokens(alpha, k)
    speedup = tokens * step_time(cost, batch, context, 0) / step_time(cost, batch, context, k)
    return Speculation(alpha, k, batch, tokens, speedup,
                       context * cost.kv_bytes_per_token / tokens)


def break_even_batch(cost: CostModel, alpha: float, k: int, context: int,
                     largest: int) -> int | None:
    """The smallest batch, up to ``largest``, at which speculating ``k`` drafts is slower than
    plain decoding (None: none)."""
    for batch in range(1, largest + 1):
        if speculation(cost, alpha, k, batch, context).speedup < 1:
            return batch
    return None


def lookahead_blocks(alpha: float, k: int, block_size: int) -> tuple[float, float]:
    """Blocks a decoding request takes for its ``k`` drafts beyond its own token's, and gives
    back after verification, per step on average: its computed tokens fall anywhere in a
    block (uniformly), and it keeps ``a`` drafts with probability ``alpha^a (1 - alpha)``
    (all ``k`` with ``alpha^k``). A step from ``c`` computed tokens holds ``ceil((c + 1 + k) /
    block_size)`` blocks, ``ceil((c + 1) / block_size)`` without drafts, and keeps ``ceil((c + 1
    + a) / block_size)``."""
    def blocks(tokens: int) -> int:
        return -(-tokens // block_size)

    accepted = [alpha ** a * (1 - alpha) for a in range(k)] + [alpha ** k]
    reserved = sum(blocks(c + 1 + k) - blocks(c + 1) for c in range(block_size)) / block_size
    freed = sum(p * (blocks(c + 1 + k) - blocks(c + 1 + a))
                for c in range(block_size) for a, p in enumerate(accepted)) / block_size
    return reserved, freed


def main() -> None:
    context, batches = 1024, (1, 8, 32, 128, 512)
    for cost, memory in ((opt13b_a100_40gb(), 40e9), (llama3_8b_h100(), 80e9)):
        most = largest_batch(cost, memory, context)
        print(f"{cost.name}, contexts of {context} tokens: at most {most} requests; tokens "
              "per second per request against plain decoding (-: does not fit), and the "
              "smallest batch at which speculating is slower")
        print("alpha   k  tokens/step  KV MB read/token  speedup at batch "
              + " ".join(f"{b:>5}" for b in batches) + "   slower from")
        for alpha in (0.5, 0.7, 0.9):
            for k in (1, 2, 4, 8):
                shown = [f"{speculation(cost, alpha, k, b, context).speedup:5.2f}"
                         if b <= most else "    -" for b in batches]
                worse = break_even_batch(cost, alpha, k, context, most)
                read = speculation(cost, alpha, k, 1, context).kv_read_per_token
                print(f"{alpha:5.1f} {k:3}  {expected_tokens(alpha, k):11.2f}  {read / 1e6:16.0f}"
                      f"{'':18}{' '.join(shown)}   {worse if worse else 'never'}")
        print()
    print(f"blocks of {BLOCK_SIZE}: blocks a decoding request takes for its drafts, and gives "
          "back after verification, per step")
    for alpha in (0.5, 0.7, 0.9):
        print(f"alpha {alpha}: " + ", ".join(
            "k {}: {:.3f} taken, {:.3f} back".format(k, *lookahead_blocks(alpha, k, BLOCK_SIZE))
            for k in (1, 2, 4, 8)))


if __name__ == "__main__":
    main()
