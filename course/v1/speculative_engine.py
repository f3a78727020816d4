"""Chapter 12: the tiny model served with speculative decoding, on chapter 9's engine::

    after step t      every request that is decoding is proposed up to k drafts
                      (request.spec_token_ids), by prompt lookup or a draft model
    step t + 1        schedule_step, then schedule_lookahead: drafts join their request's
                      chunk where the budget and every group's pool have room
                      engine_step, chapter 9's, unchanged: one batch, one variable-length
                      query per request; a chunk with drafts ends past its request's known
                      tokens, so it samples nothing there
                      verify: the logits of such a chunk's last k + 1 rows, greedy
                      acceptance, the accepted drafts and one token more emitted, rollback

Verification reads the rows of the last layer's output that the model step computed and
sampled none of: vLLM's model runner keeps the hidden states of the whole batch and computes
logits at the rows its sampler needs (``logits_indices``), one per request and ``k`` more
for a request with drafts. ``LastHiddenStates`` keeps them here, around the model the engine
runs, so chapter 9's step serves speculation as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course.tiny_model import TinyModel
from course.v1.chunked_engine import ChunkedEngine
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, Schedule, schedule_step
from course.v1.draft_model import DraftModel
from course.v1.spec_decode import accept_greedy, ngram_propose, rollback, schedule_lookahead

Proposer = Callable[[ChunkedRequest, int], list[int]]


class LastHiddenStates:
    """``model``, keeping its last layer's output for every row of the latest step
    (``hidden``); everything else is the model's own."""

    def __init__(self, model: TinyModel) -> None:
        self.model = model
        self.hidden: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def finish_layer(self, layer: int, x: torch.Tensor, attention: torch.Tensor
                     ) -> torch.Tensor:
        x = self.model.finish_layer(layer, x, attention)
        if layer == self.model.config.num_layers - 1:
            self.hidden = x
        return x


def prompt_lookup(min_n: int = 1, max_n: int = 3) -> Proposer:
    """A proposer by prompt lookup over a request's tokens (vLLM's defaults: n-grams of 1 to
    3 tokens)."""

    def propose(request: ChunkedRequest, k: int) -> list[int]:
        return ngram_propose(request.tokens, min_n, max_n, k)

    return propose


def with_lookahead(schedule: Callable[[ChunkedScheduler], Schedule],
                   lookahead: Callable[[ChunkedScheduler, Schedule], Schedule]
                   ) -> Callable[[ChunkedScheduler], Schedule]:
    """``schedule``, then ``lookahead``: the drafts of the requests it scheduled to their
    last known token."""
    return lambda scheduler: lookahead(scheduler, schedule(scheduler))


class SpeculativeEngine(ChunkedEngine):
    """Chapter 9's engine, proposing up to ``num_speculative_tokens`` drafts per request and
    verifying them greedily in the next step. ``propose(request, k)`` gives at most ``k``
    drafts for what follows ``request.tokens``; ``schedule`` and the other keywords are
    ``ChunkedEngine``'s; ``accept``, ``lookahead`` and ``roll_back`` are chapter 12's
    ``accept_greedy``, ``schedule_lookahead`` and ``rollback`` unless given. ``drafted`` and
    ``accepted`` count drafts over the run. With a ``draft`` model, it proposes, its K/V in
    this engine's pool (``course.v1.draft_model``)."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, num_speculative_tokens: int,
                 propose: Proposer | None = None,
                 schedule: Callable[[ChunkedScheduler], Schedule] | None = None,
                 accept: Callable = accept_greedy, lookahead: Callable = schedule_lookahead,
                 roll_back: Callable = rollback, draft: DraftModel | None = None,
                 **engine: Any) -> None:
        super().__init__(model, num_blocks, block_size, max_num_batched_tokens,
                         schedule=with_lookahead(schedule or schedule_step, lookahead),
                         **engine)
        self.accept, self.roll_back = accept, roll_back
        self.model = LastHiddenStates(model)
        self.num_speculative_tokens = num_speculative_tokens
        self.draft = draft
        if draft is not None:
            if propose is not None:
                raise ValueError("drafts come from the draft model or from propose, not both")
            draft.attach(self)
        self.propose = propose or prompt_lookup()
        self.drafted = 0
        self.accepted = 0

    def execute(self, plan: Schedule) -> None:
        """The model step (and the draft model's over the same chunks), the drafts it carried
        verified, the next drafts proposed."""
        if plan.chunks:
            self.model_step(self, plan)
            if self.draft is not None:
                self.draft.before_verification(plan)
            self.verify(plan)
            if self.draft is not None:
                self.draft.after_verification(plan)
        self.propose_drafts()

    def verify(self, plan: Schedule) -> None:
        """Each chunk that carried drafts: the target's greedy choice after its newest known
        token and after each draft (the chunk's last ``k + 1`` rows), the tokens greedy
        acceptance keeps emitted (no more than the request still wants), the rest rolled
        back."""
        hidden, end = self.model.hidden, 0
        for chunk in plan.chunks:
            request, end = chunk.request, end + chunk.num_tokens
            drafts = request.spec_token_ids
            if chunk.end <= request.num_tokens:
                continue  # no drafts rode on this chunk: chapter 9's step sampled it
            logits = self.model.logits(hidden[end - len(drafts) - 1:end])
            emitted = self.accept(drafts, logits.argmax(dim=-1).tolist())
            kept = emitted[:request.output_len - len(request.output)]
            for token, row in zip(kept, logits, strict=False):
                request.emit(token, row)
            self.drafted += len(drafts)
            self.accepted += len(emitted) - 1
            self.roll_back(self.scheduler, request, min(len(emitted) - 1, len(kept)))

    def propose_drafts(self) -> None:
        """Drafts for every running request whose tokens are all computed but the newest,
        no more than it can still emit besides the token verification adds (from the draft
        model, where there is one, in one batch); none for the others (a prompt still in
        prefill)."""
        wanted = []
        for request in self.scheduler.running:
            room = min(self.num_speculative_tokens,
                       request.output_len - len(request.output) - 1)
            decoding = request.num_computed_tokens == request.num_tokens - 1
            request.spec_token_ids = []
            if decoding and room > 0:
                wanted.append((request, room))
        if self.draft is not None:
            self.draft.propose(wanted)
            return
        for request, room in wanted:
            request.spec_token_ids = self.propose(request, room)
