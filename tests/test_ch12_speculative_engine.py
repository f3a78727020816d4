"""The tiny model served with speculative decoding (``course.v1.speculative_engine``): token
for token, logits too, what contiguous greedy generation gives, with drafts by prompt lookup
and by a proposer that knows the answer and errs where it is told (so every draft accepted,
none, and every count between are reached); k from 1 to 5, blocks of 1, chunked prefill, a
pool small enough to preempt, prefix hits on blocks verification wrote, and a hybrid model
with sliding windows. Every block comes back; a second wave of requests whose prompts are the
first wave's tokens hits the blocks the first wave cached, and is token-exact too, so no
cached block holds a rejected draft's K/V. A verification that emits the target's every
choice, and a rollback that forgets the count or the blocks, are caught by the same
comparison.

A draft model whose K/V live in the target's pool (``course.v1.draft_model``): with the
target's own weights every draft is accepted, and another model's every proposal is exactly
its own contiguous greedy continuation, in the same scenarios; a draft that never writes the
step's tokens is caught by that comparison; a draft that cannot share the target's blocks is
refused.
"""

from __future__ import annotations

import random

import pytest
import torch
from mutants.ch12 import _blocks_kept, _drafts_cleared_before_counting, _pulls_back_the_accepted

from course.tiny_model import TinyConfig, TinyModel, generate_contiguous
from course.v1 import spec_decode
from course.v1.chunked_engine import engine_requests, serve_chunked
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.draft_model import DraftModel
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.speculative_engine import Proposer, SpeculativeEngine, prompt_lookup
from kernels.sliding_window_attention import window_attention_reference


def _specs(seed: int, count: int, shared: int = 0) -> list[tuple[list[int], int, int]]:
    """Requests with prompts of 1 to 12 tokens, some beginning with ``shared`` tokens in
    common; outputs long enough for drafts to matter; arrivals spread over 4 steps."""
    rng = random.Random(seed)
    prefix = [rng.randrange(128) for _ in range(shared)]
    return [((prefix if rng.random() < 0.6 else []) + [rng.randrange(128) for _ in
                                                       range(rng.randint(1, 12))],
             rng.randint(1, 24), rng.randint(0, 4)) for _ in range(count)]


def _knowing(model: TinyModel, specs: list[tuple], seed: int) -> Proposer:
    """Drafts from the true continuation, each wrong (the next token id) with probability
    1/3: runs of accepted drafts of every length, and rejections at every place."""
    truth = [generate_contiguous(model, prompt, output_len)[0] for prompt, output_len, _ in specs]
    rng = random.Random(seed)

    def propose(request: ChunkedRequest, k: int) -> list[int]:
        done = len(request.output)
        right = truth[request.id][done:done + k]  # what follows the newest token
        return [t if rng.random() > 1 / 3 else (t + 1) % 128 for t in right]

    return propose


def _assert_same(model: TinyModel, served: list[ChunkedRequest]) -> None:
    for request in served:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        assert request.output == tokens, f"request {request.id} ({request.prompt})"
        torch.testing.assert_close(torch.stack(request.logits), torch.stack(logits),
                                   atol=1e-4, rtol=1e-4)


def _watch(engine: SpeculativeEngine) -> None:
    """After every step, each running request holds, in every group, the blocks its
    computed tokens fill and none past them: the blocks of rejected drafts are back."""
    step = engine.step

    def watched():
        plan = step()
        kv = engine.kv_cache
        for request in engine.scheduler.running:
            for manager in kv.managers:
                held = len(manager.tables[request.id])
                assert held == -(-request.num_computed_tokens // kv.block_size), (
                    f"request {request.id} holds {held} blocks for "
                    f"{request.num_computed_tokens} computed tokens")
        return plan

    engine.step = watched


def _serve(model: TinyModel, specs: list[tuple], k: int, propose: Proposer | None,
           num_blocks: int, block_size: int, budget: int, **engine) -> SpeculativeEngine:
    """Serve ``specs``, then a second wave whose prompts are the first wave's whole tokens
    (as many as the pool holds: their hits are blocks the first wave cached, verified ones
    among them); every request token-exact, every block back."""
    eng = SpeculativeEngine(model, num_blocks, block_size, budget, k, propose=propose,
                            **engine)
    _watch(eng)
    served = serve_chunked(eng, engine_requests(specs))
    assert len(served) == len(specs)
    _assert_same(model, served)
    hits_before = eng.prompt_hits
    longest = (num_blocks - 2) * block_size - 3  # what the pool holds, run alone
    again = [(r.tokens[:longest], 3, 0) for r in sorted(served, key=lambda r: r.id)]
    eng.propose = prompt_lookup()
    second = serve_chunked(eng, [ChunkedRequest(100 + i, p, n, a)
                                 for i, (p, n, a) in enumerate(again)])
    _assert_same(model, second)
    if num_blocks >= 60:  # a pool with room to keep what the first wave cached
        assert eng.prompt_hits > hits_before
    assert eng.kv_cache.num_held() == 0 and not any(eng.kv_cache.pool.ref_counts)
    return eng


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("block_size", [1, 4])
def test_speculation_serves_what_greedy_generation_gives(k, block_size):
    model, specs = TinyModel(seed=3), _specs(seed=k, count=5)
    eng = _serve(model, specs, k, _knowing(model, specs, seed=k), 400, block_size, 16)
    assert 0 < eng.accepted < eng.drafted


def test_prompt_lookup_serves_what_greedy_generation_gives():
    model, specs = TinyModel(seed=3), _specs(seed=0, count=6)
    eng = _serve(model, specs, 3, None, 200, 4, 16)
    assert 0 < eng.accepted < eng.drafted


@pytest.mark.parametrize("budget", [1, 3, 6])
def test_drafts_ride_beside_chunked_prefill(budget):
    """A budget of 1 leaves no room for a draft: plain decoding; of 3 and 6, drafts share
    steps with prompts still in prefill."""
    model, specs = TinyModel(seed=5), _specs(seed=budget, count=5)
    eng = _serve(model, specs, 4, _knowing(model, specs, seed=budget), 200, 2, budget)
    kinds = {kind for record in eng.records for *_, kind in record.chunks}
    assert (eng.drafted == 0) == (budget == 1)
    if budget == 6:
        assert any({"prefill", "verify"} <= {kind for *_, kind in r.chunks}
                   for r in eng.records), kinds


def test_a_pool_too_small_preempts_and_speculation_still_gives_the_same_tokens():
    model, specs = TinyModel(seed=7), _specs(seed=9, count=6)
    eng = _serve(model, specs, 4, _knowing(model, specs, seed=9), 14, 2, 16)
    assert sum(len(record.preempted) for record in eng.records) > 0
    assert eng.accepted > 0


def test_prefix_hits_and_speculation_give_the_same_tokens():
    model, specs = TinyModel(seed=2), _specs(seed=4, count=6, shared=9)
    eng = _serve(model, specs, 3, _knowing(model, specs, seed=4), 100, 4, 12)
    assert eng.prompt_hits > 0 and eng.accepted > 0


@pytest.mark.parametrize("windows", [(3, None), (None, 2, None, 2), (5, 5)],
                         ids=["window 3, full", "full, window 2", "windows only"])
def test_a_hybrid_model_with_speculation_gives_the_same_tokens(windows):
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows), seed=4)
    specs = _specs(seed=len(windows), count=5, shared=6)
    eng = _serve(model, specs, 4, _knowing(model, specs, seed=1), 60, 2, 10,
                 kv_cache=HybridKVCacheCoordinator, window_attention=window_attention_reference)
    assert 0 < eng.accepted < eng.drafted


def test_without_drafts_it_is_chapter_9s_engine():
    model, specs = TinyModel(seed=3), _specs(seed=1, count=4)
    eng = _serve(model, specs, 0, None, 100, 4, 16)
    assert eng.drafted == 0
    assert all(kind != "verify" for record in eng.records for *_, kind in record.chunks)


# --- the comparison catches a wrong verification or rollback --------------------------------


def _verify_emitting_every_choice(self, plan):
    """Wrong: emits the target's choice at every place, as if each came after the tokens the
    target chose; those after a rejected draft were computed after the draft."""
    hidden, end = self.model.hidden, 0
    for chunk in plan.chunks:
        request, end = chunk.request, end + chunk.num_tokens
        drafts = request.spec_token_ids
        if chunk.end <= request.num_tokens:
            continue
        logits = self.model.logits(hidden[end - len(drafts) - 1:end])
        choices = logits.argmax(dim=-1).tolist()[:request.output_len - len(request.output)]
        for token, row in zip(choices, logits, strict=False):
            request.emit(token, row)
        spec_decode.rollback(self.scheduler, request, min(len(drafts), len(choices)))


@pytest.mark.parametrize("where, wrong", [
    ("verify", _verify_emitting_every_choice),
    ("rollback", _drafts_cleared_before_counting),
    ("rollback", _pulls_back_the_accepted),
    ("rollback", _blocks_kept),
], ids=["emits-every-choice", "rollback-keeps-the-count", "rollback-pulls-back-the-accepted",
        "rollback-keeps-the-blocks"])
def test_a_wrong_verification_or_rollback_is_caught(where, wrong, monkeypatch):
    if where == "verify":
        monkeypatch.setattr(SpeculativeEngine, "verify", wrong)
    model, specs = TinyModel(seed=3), _specs(seed=2, count=5)
    given = {"roll_back": wrong} if where == "rollback" else {}
    with pytest.raises((AssertionError, ValueError)):
        _serve(model, specs, 3, _knowing(model, specs, seed=2), 60, 1, 16, **given)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the same serving "
                    "runs above in PyTorch on the CPU)")
def test_speculation_through_the_triton_kernel_at_serving_shapes_on_the_gpu():
    """Blocks of 16, a budget of 512, 32 requests of up to 300 prompt tokens and 64 generated,
    5 drafts a step, through chapter 9's Triton kernel on the GPU."""
    model = TinyModel(TinyConfig(hidden=256, num_layers=4, num_q_heads=8, num_kv_heads=2,
                                 head_dim=64, mlp_hidden=512), seed=1, device="cuda")
    rng = random.Random(7)
    specs = [([rng.randrange(128) for _ in range(rng.randint(16, 300))], rng.randint(8, 64),
              rng.randint(0, 8)) for _ in range(32)]
    eng = SpeculativeEngine(model, 2048, 16, 512, 5, propose=_knowing(model, specs, seed=7))
    served = serve_chunked(eng, engine_requests(specs))
    assert len(served) == 32 and 0 < eng.accepted < eng.drafted
    for request in served:
        tokens, _ = generate_contiguous(model, request.prompt, request.output_len)
        assert request.output == tokens, f"request {request.id}"
    assert eng.kv_cache.num_held() == 0


# --- a draft model whose K/V live in the target's pool ---------------------------------------


def _serve_with_draft(model: TinyModel, draft_model: TinyModel, specs: list[tuple], k: int,
                      num_blocks: int, block_size: int, budget: int, **engine
                      ) -> tuple[SpeculativeEngine, list[tuple[list[int], list[int]]]]:
    """Serve ``specs`` with ``draft_model`` proposing; every request token-exact, every block
    back; each proposal recorded with the tokens it followed."""
    draft = DraftModel(draft_model)
    eng = SpeculativeEngine(model, num_blocks, block_size, budget, k, draft=draft, **engine)
    proposals, propose = [], draft.propose

    def recorded(wanted):
        propose(wanted)
        proposals.extend((list(r.tokens), list(r.spec_token_ids)) for r, _ in wanted)

    draft.propose = recorded
    served = serve_chunked(eng, engine_requests(specs))
    assert len(served) == len(specs)
    _assert_same(model, served)
    assert eng.kv_cache.num_held() == 0
    return eng, proposals


DRAFT_SCENARIOS = [
    # (blocks in the pool, block size, tokens per step, drafts per step, windows, shared prefix)
    (200, 4, 16, 4, None, 0),
    (400, 1, 16, 3, None, 0),
    (200, 2, 5, 4, None, 0),
    (20, 2, 16, 4, None, 0),
    (100, 4, 12, 3, None, 9),
    (80, 2, 10, 4, (3, None), 6),
]
DRAFT_IDS = ["blocks of 4", "blocks of 1", "chunked prefill", "preemption", "prefix hits",
             "hybrid"]


def _target(windows) -> TinyModel:
    return TinyModel(TinyConfig(num_layers=len(windows), windows=windows) if windows
                     else TinyConfig(), seed=3)


def _hybrid(windows) -> dict:
    return dict(kv_cache=HybridKVCacheCoordinator,
                window_attention=window_attention_reference) if windows else {}


@pytest.mark.parametrize(("num_blocks", "block_size", "budget", "k", "windows", "shared"),
                         DRAFT_SCENARIOS[:-1], ids=DRAFT_IDS[:-1])
def test_a_draft_that_is_the_target_has_every_draft_accepted(num_blocks, block_size, budget, k,
                                                             windows, shared):
    """The target's own weights as the draft: its proposals are the target's greedy tokens
    only if its K/V in the pool are right at every position, after every rollback. (A draft
    attends over every token, so a hybrid target's own weights cannot be its draft: the
    next test serves the hybrid model with another draft.)"""
    model, specs = _target(windows), _specs(seed=block_size + k, count=5, shared=shared)
    eng, _ = _serve_with_draft(model, _target(windows), specs, k, num_blocks, block_size,
                               budget, **_hybrid(windows))
    assert eng.drafted > 0 and eng.accepted == eng.drafted
    if num_blocks == 20:
        assert sum(len(record.preempted) for record in eng.records) > 0


@pytest.mark.parametrize(("num_blocks", "block_size", "budget", "k", "windows", "shared"),
                         DRAFT_SCENARIOS, ids=DRAFT_IDS)
def test_a_draft_model_proposes_its_own_greedy_continuation(num_blocks, block_size, budget, k,
                                                            windows, shared):
    """Another, smaller model as the draft: most drafts are rejected, and each proposal is
    still exactly what that model generates greedily after the request's tokens with a
    contiguous cache, so its K/V in the pool held no rejected token where it read."""
    model, specs = _target(windows), _specs(seed=block_size + k, count=5, shared=shared)
    small = TinyModel(TinyConfig(num_layers=1, hidden=32, mlp_hidden=64), seed=11)
    eng, proposals = _serve_with_draft(model, small, specs, k, num_blocks, block_size, budget,
                                       **_hybrid(windows))
    assert eng.drafted > eng.accepted and len(proposals) > 10
    for tokens, drafts in proposals:
        if drafts:
            assert drafts == generate_contiguous(small, tokens, len(drafts))[0], tokens


def test_a_draft_that_skips_the_steps_chunks_is_caught():
    """The comparison above fails for a draft that never writes the K/V of the tokens the
    steps compute (its prompt, the tokens verification kept)."""
    model, specs = _target(None), _specs(seed=5, count=4)
    small = TinyModel(TinyConfig(num_layers=1, hidden=32, mlp_hidden=64), seed=11)
    original = DraftModel.before_verification
    DraftModel.before_verification = lambda self, plan: None
    try:
        _, proposals = _serve_with_draft(model, small, specs, 3, 200, 4, 16)
    finally:
        DraftModel.before_verification = original
    assert any(drafts and drafts != generate_contiguous(small, tokens, len(drafts))[0]
               for tokens, drafts in proposals)


def test_a_draft_that_cannot_share_the_targets_blocks_is_refused():
    model = TinyModel(seed=3)
    with pytest.raises(ValueError, match="K/V"):
        SpeculativeEngine(model, 40, 4, 16, 3,
                          draft=DraftModel(TinyModel(TinyConfig(num_kv_heads=4), seed=1)))
    sliding = TinyModel(TinyConfig(windows=(3, 3)), seed=3)
    with pytest.raises(ValueError, match="full-attention"):
        SpeculativeEngine(sliding, 40, 4, 16, 3, draft=DraftModel(TinyModel(seed=1)),
                          **_hybrid((3, 3)))
    with pytest.raises(ValueError, match="not both"):
        SpeculativeEngine(model, 40, 4, 16, 3, draft=DraftModel(TinyModel(seed=1)),
                          propose=prompt_lookup())
