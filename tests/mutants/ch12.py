"""Wrong chapter 12 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

from course.v1.chunked_scheduler import Chunk
from mutants import Rule


def _named(name: str, fn):
    fn.__name__ = name
    return fn


# --- ngram_propose ----------------------------------------------------------------------------


def _lookup(longest_first=True, first_start=True, overlap=True, own_place=False, cap=True,
            lowest_n=None):
    def ngram_propose(tokens, min_n, max_n, k):
        tokens = list(tokens)
        top = min(max_n, len(tokens) - 1)
        low = min_n if lowest_n is None else lowest_n
        sizes = range(top, low - 1, -1) if longest_first else range(low, top + 1)
        for n in sizes:
            suffix = tokens[-n:]
            last = len(tokens) - n + (1 if own_place else 0)
            if not overlap:
                last = min(last, len(tokens) - 2 * n + 1)
            starts = range(last) if first_start else range(last - 1, -1, -1)
            for start in starts:
                if tokens[start:start + n] == suffix:
                    following = tokens[start + n:]
                    return following[:k] if cap else following
        return []

    return ngram_propose


_shortest_n_first = _named("_shortest_n_first", _lookup(longest_first=False))
_latest_occurrence = _named("_latest_occurrence", _lookup(first_start=False))
_no_overlapping_occurrence = _named("_no_overlapping_occurrence", _lookup(overlap=False))
_finds_its_own_place = _named("_finds_its_own_place", _lookup(own_place=True))
_every_following_token = _named("_every_following_token", _lookup(cap=False))
_below_min_n = _named("_below_min_n", _lookup(lowest_n=1))


# --- accept_greedy ----------------------------------------------------------------------------


def _accept(bonus="target", filtering=False, shifted=False):
    def accept_greedy(drafts, target):
        kept = []
        for i, draft in enumerate(drafts):
            choice = target[i + 1] if shifted else target[i]
            if draft == choice:
                kept.append(draft)
            elif filtering:
                continue
            else:
                if bonus == "draft":
                    return [*kept, draft]
                break
        if bonus == "none":
            return kept
        if bonus == "last":
            return [*kept, target[-1]]
        return [*kept, target[len(kept)]]

    return accept_greedy


_no_token_after_the_drafts = _named("_no_token_after_the_drafts", _accept(bonus="none"))
_always_the_last_choice = _named("_always_the_last_choice", _accept(bonus="last"))
_keeps_agreeing_drafts_after_a_rejection = _named(
    "_keeps_agreeing_drafts_after_a_rejection", _accept(filtering=True))
_emits_the_rejected_draft = _named("_emits_the_rejected_draft", _accept(bonus="draft"))
_compares_with_the_next_choice = _named("_compares_with_the_next_choice", _accept(shifted=True))


# --- schedule_lookahead -----------------------------------------------------------------------


def _lookahead(cut=True, spend=True, from_start=True, all_or_none=True, drop=True,
               at_end_only=True, settle=True):
    def schedule_lookahead(scheduler, plan):
        kv = scheduler.kv_cache
        budget = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
        for index, chunk in enumerate(plan.chunks):
            request = chunk.request
            if not request.spec_token_ids:
                continue
            if at_end_only and chunk.end != request.num_tokens:
                continue
            if cut:
                request.spec_token_ids = request.spec_token_ids[:budget]
            drafts = request.spec_token_ids
            if not drafts:
                continue
            request.num_computed_tokens = chunk.start if from_start else chunk.end
            sizes = [len(drafts)] if all_or_none else range(len(drafts), 0, -1)
            for size in sizes:
                asked = chunk.num_tokens + size if from_start else size
                if kv.allocate_slots(request, asked):
                    request.spec_token_ids = drafts[:size]
                    plan.chunks[index] = Chunk(request, chunk.start, chunk.num_tokens + size)
                    if spend:
                        budget -= size
                    break
            else:
                if drop:
                    request.spec_token_ids = []
            request.num_computed_tokens = plan.chunks[index].end if settle else chunk.start
        return plan

    return schedule_lookahead


_drafts_past_the_budget = _named("_drafts_past_the_budget", _lookahead(cut=False))
_budget_never_spent = _named("_budget_never_spent", _lookahead(spend=False))
_room_asked_from_the_chunks_end = _named("_room_asked_from_the_chunks_end",
                                         _lookahead(from_start=False))
_as_many_drafts_as_fit = _named("_as_many_drafts_as_fit", _lookahead(all_or_none=False))
_refused_drafts_kept = _named("_refused_drafts_kept", _lookahead(drop=False))
_drafts_on_a_prefill_chunk = _named("_drafts_on_a_prefill_chunk",
                                    _lookahead(at_end_only=False))
_computed_left_at_the_start = _named("_computed_left_at_the_start", _lookahead(settle=False))


# --- rollback ---------------------------------------------------------------------------------


def _rollback(pull="rejected", clear=True, give_back=True, last_first=True, every_group=True,
              whole_blocks_only=False):
    def rollback(scheduler, request, num_accepted):
        rejected = len(request.spec_token_ids) - num_accepted
        if not clear:
            pass
        elif pull == "after clearing":
            request.spec_token_ids = []
            rejected = 0
        request.num_computed_tokens -= num_accepted if pull == "accepted" else rejected
        if clear:
            request.spec_token_ids = []
        kv = scheduler.kv_cache
        size = kv.block_size
        keep = request.num_computed_tokens // size if whole_blocks_only \
            else (request.num_computed_tokens + size - 1) // size
        for manager in (kv.managers if every_group else kv.managers[:1]):
            table = manager.tables[request.id]
            if not give_back:
                continue
            gone = table[keep:]
            kv.pool.free_blocks(list(reversed(gone)) if last_first else gone)
            del table[keep:]

    return rollback


_pulls_back_the_accepted = _named("_pulls_back_the_accepted", _rollback(pull="accepted"))
_drafts_cleared_before_counting = _named("_drafts_cleared_before_counting",
                                         _rollback(pull="after clearing"))
_drafts_left_in_place = _named("_drafts_left_in_place", _rollback(clear=False))
_blocks_kept = _named("_blocks_kept", _rollback(give_back=False))
_blocks_back_first_first = _named("_blocks_back_first_first", _rollback(last_first=False))
_first_group_only = _named("_first_group_only", _rollback(every_group=False))
_partial_block_given_back = _named("_partial_block_given_back",
                                   _rollback(whole_blocks_only=True))


MUTANTS = {
    "ngram_propose": [
        (_shortest_n_first, "The longest n that has an occurrence wins"),
        (_latest_occurrence, "take the first"),
        (_no_overlapping_occurrence, "may overlap the n-gram itself"),
        (_finds_its_own_place, "is no earlier occurrence"),
        (_every_following_token, "at most k drafts"),
        (_below_min_n, "n never goes below min_n"),
    ],
    "accept_greedy": [
        (_no_token_after_the_drafts, "One token more follows the accepted drafts"),
        (_always_the_last_choice, "target[accepted], not its last"),
        (_keeps_agreeing_drafts_after_a_rejection, "Acceptance stops at the first draft"),
        (_emits_the_rejected_draft, "the target's own choice is emitted, not the draft"),
        (_compares_with_the_next_choice, "Draft i is compared with target[i]"),
    ],
    "schedule_lookahead": [
        (_drafts_past_the_budget, "Drafts take only what the plan left of the budget"),
        (_budget_never_spent, "come off the budget before the next chunk's are cut"),
        (_room_asked_from_the_chunks_end, "Room is asked from the chunk's first token"),
        (_as_many_drafts_as_fit, "All or none"),
        (_refused_drafts_kept, "A request refused room keeps no drafts"),
        (_drafts_on_a_prefill_chunk, "Only a chunk that ends at its request's last known token"),
        (_computed_left_at_the_start, "num_computed_tokens ends at the chunk's end"),
    ],
    "rollback": [
        (_pulls_back_the_accepted, "by the drafts rejected"),
        (_drafts_cleared_before_counting, "before emptying spec_token_ids"),
        (_drafts_left_in_place, "spec_token_ids = []"),
        (_blocks_kept, "give them back to the pool and take them out of the table"),
        (_blocks_back_first_first, "last first"),
        (_first_group_only, "in each of kv.managers"),
        (_partial_block_given_back, "a block partly filled by computed tokens stays"),
    ],
}

RULES = [
    Rule("The longest ``n`` found wins", "ngram_propose", ("_shortest_n_first",)),
    Rule("of its occurrences, the first", "ngram_propose", ("_latest_occurrence",)),
    Rule("an earlier occurrence may overlap the n-gram itself", "ngram_propose",
         ("_no_overlapping_occurrence",)),
    Rule("at every start before ``len(tokens) - n``", "ngram_propose",
         ("_finds_its_own_place",)),
    Rule("at most ``k`` of them", "ngram_propose", ("_every_following_token",)),
    Rule("For ``n`` from ``max_n`` down to ``min_n``", "ngram_propose", ("_below_min_n",)),
    Rule("then one token more, the target's own", "accept_greedy",
         ("_no_token_after_the_drafts", "_always_the_last_choice",
          "_emits_the_rejected_draft")),
    Rule("Drafts are accepted from the first while each equals the target's choice at its "
         "place", "accept_greedy",
         ("_keeps_agreeing_drafts_after_a_rejection", "_compares_with_the_next_choice")),
    Rule("the request keeps only the drafts the budget holds", "schedule_lookahead",
         ("_drafts_past_the_budget",)),
    Rule("the drafts come off the budget", "schedule_lookahead", ("_budget_never_spent",)),
    Rule("room for the chunk and its drafts is asked from the chunk's first token",
         "schedule_lookahead", ("_room_asked_from_the_chunks_end",)),
    Rule("refused: the request's drafts become ``[]`` and its chunk stays", "schedule_lookahead",
         ("_as_many_drafts_as_fit", "_refused_drafts_kept")),
    Rule("which ends at the request's last known token", "schedule_lookahead",
         ("_drafts_on_a_prefill_chunk",)),
    Rule("either way ``request.num_computed_tokens`` is its chunk's end", "schedule_lookahead",
         ("_computed_left_at_the_start",)),
    Rule("pulls back by the drafts rejected", "rollback",
         ("_pulls_back_the_accepted", "_drafts_cleared_before_counting")),
    Rule("the request has no drafts left", "rollback", ("_drafts_left_in_place",)),
    Rule("the blocks past them go back to the pool, last first", "rollback",
         ("_blocks_kept", "_blocks_back_first_first")),
    Rule("in every group", "rollback", ("_first_group_only",)),
    Rule("keeps the blocks its computed tokens fill", "rollback",
         ("_partial_block_given_back",)),
]
