"""An EAGLE-shaped draft head in the speculative engine (``course.v1.draft_model.DraftHead``):
its proposals against a second implementation written without the pool (the target's hidden
states and the head's outputs computed over whole sequences, again for every draft), in the
scenarios of the other speculative tests; the tokens served against greedy generation.

And the prefix-hit rule it needs: with ``use_eagle`` the hit is a block shorter (vLLM drops
the last matched block), and without it a request whose prefix another request cached, but
whose token after that prefix differs, gets proposals the head would never make: its K/V at
the hit's last token were made from the other request's next token.
"""

from __future__ import annotations

import pytest
import torch
from test_ch12_speculative_engine import DRAFT_IDS, DRAFT_SCENARIOS, _hybrid, _specs, _target

from course.tiny_model import TinyConfig, TinyModel, causal_attention, generate_contiguous
from course.v1.chunked_engine import engine_requests, serve_chunked
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.draft_model import DraftHead
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.kv_coordinator import KVCacheCoordinator
from course.v1.speculative_engine import SpeculativeEngine


def _through(model: TinyModel, x: torch.Tensor) -> torch.Tensor:
    """``model``'s layers over the rows ``x`` of one sequence, each attending to the rows
    before it (within its window): the last layer's output."""
    positions = torch.arange(x.shape[0])
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, positions)
        x = model.finish_layer(layer, x, causal_attention(q, k, v, model.scale,
                                                          window=model.config.window(layer)))
    return x


def _expected_drafts(target: TinyModel, head: DraftHead, tokens: list[int], k: int
                     ) -> list[int]:
    """The head's ``k`` drafts after ``tokens``, every output computed over the whole
    sequence: position t reads token t + 1 and the target's hidden state at t; a draft's
    position reads the draft and the head's own output at the position before."""
    hidden = _through(target, target.embed(torch.tensor(tokens)))
    inputs, states = list(tokens[1:]), [hidden[t] for t in range(len(tokens) - 1)]
    drafts = []
    for _ in range(k):
        x = head.model.embed(torch.tensor(inputs)) + torch.stack(states) @ head.projection.T
        out = _through(head.model, x)
        drafts.append(int(head.model.logits(out[-1:])[0].argmax()))
        inputs.append(drafts[-1])
        states.append(out[-1])
    return drafts


def _serve(target: TinyModel, specs: list[tuple], k: int, num_blocks: int, block_size: int,
           budget: int, use_eagle: bool = True, **engine) -> tuple[DraftHead, list[tuple]]:
    """``specs`` served with a draft head proposing; each proposal recorded with the tokens
    it followed; tokens against greedy generation, every block back."""
    head = DraftHead(TinyModel(TinyConfig(num_layers=1), seed=9), seed=1)
    eng = SpeculativeEngine(target, num_blocks, block_size, budget, k, draft=head, **engine)
    eng.kv_cache.use_eagle = use_eagle
    proposals, propose = [], head.propose

    def recorded(wanted):
        propose(wanted)
        proposals.extend((list(r.tokens), list(r.spec_token_ids)) for r, _ in wanted)

    head.propose = recorded
    served = serve_chunked(eng, specs if isinstance(specs[0], ChunkedRequest)
                           else engine_requests(specs))
    for request in served:
        assert request.output == generate_contiguous(target, request.prompt,
                                                     request.output_len)[0]
    assert eng.kv_cache.num_held() == 0
    return head, proposals


@pytest.mark.parametrize(("num_blocks", "block_size", "budget", "k", "windows", "shared"),
                         DRAFT_SCENARIOS, ids=DRAFT_IDS)
def test_the_heads_drafts_are_the_ones_it_makes_over_whole_sequences(num_blocks, block_size,
                                                                    budget, k, windows, shared):
    target = _target(windows)
    head, proposals = _serve(target, _specs(block_size + k, 5, shared), k, num_blocks,
                             block_size, budget, **_hybrid(windows))
    made = [(tokens, drafts) for tokens, drafts in proposals if drafts]
    assert len(made) > 10
    for tokens, drafts in made:
        assert drafts == _expected_drafts(target, head, tokens, len(drafts)), tokens


def _sharing_a_prefix_then_differing() -> list[ChunkedRequest]:
    """Request 0 computes and caches 8 tokens and the ones after; request 1, arriving once
    they are cached, shares those 8 (two blocks of 4) and differs from token 8 on."""
    prefix = [5, 17, 40, 3, 99, 23, 61, 8]
    return [ChunkedRequest(0, prefix + [70, 71, 72], 6, 0),
            ChunkedRequest(1, prefix + [12, 13], 6, 6)]


def test_without_the_rule_a_hit_gives_the_head_another_requests_token():
    target = TinyModel(seed=3)
    head, proposals = _serve(target, _sharing_a_prefix_then_differing(), 3, 60, 4, 16,
                             use_eagle=False)
    wrong = [(tokens, drafts) for tokens, drafts in proposals if drafts
             and drafts != _expected_drafts(target, head, tokens, len(drafts))]
    assert wrong and all(tokens[:10] == [5, 17, 40, 3, 99, 23, 61, 8, 12, 13]
                         for tokens, _ in wrong)


def test_with_the_rule_the_same_requests_get_the_heads_own_drafts():
    target = TinyModel(seed=3)
    head, proposals = _serve(target, _sharing_a_prefix_then_differing(), 3, 60, 4, 16)
    assert all(drafts == _expected_drafts(target, head, tokens, len(drafts))
               for tokens, drafts in proposals if drafts)


@pytest.mark.parametrize("coordinator", [KVCacheCoordinator, HybridKVCacheCoordinator])
def test_with_use_eagle_a_hit_is_a_block_shorter(coordinator):
    kv = coordinator(30, 4)
    first = ChunkedRequest(0, list(range(14)), 1)
    assert kv.allocate_slots(first, 14)
    first.num_computed_tokens = 14
    kv.cache_blocks(first)  # blocks 0, 1 and 2 (tokens 0 to 11)
    again = ChunkedRequest(1, list(range(14)), 1)
    assert kv.get_computed_tokens(again) == 12
    kv.use_eagle = True
    assert kv.get_computed_tokens(again) == 8
    assert kv.get_computed_tokens(ChunkedRequest(2, [0, 1, 2, 3, 9], 1)) == 0


def test_a_head_of_another_hidden_size_is_refused():
    with pytest.raises(ValueError, match="hidden size"):
        SpeculativeEngine(TinyModel(seed=3), 40, 4, 16, 3,
                          draft=DraftHead(TinyModel(TinyConfig(hidden=32, num_layers=1))))
