"""A hybrid model's cache, sized and kept (``course.hybrid_models``, ``course.hybrid_sizing``,
``course.hybrid_cache``): each function against a second, differently written one (layer by
layer, token by token, every hit length tried), on the published models and on seeded random
cases; and each comparison shown to catch known wrong versions, so that it can fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from course.hybrid_cache import (
    NULL_BLOCK,
    blocks_needed,
    free_skipped_blocks,
    full_attention_hit,
    hybrid_hit,
    skipped_tokens,
    sliding_window_hit,
)
from course.hybrid_manager import HybridBlockManager
from course.hybrid_models import (
    FULL,
    HYBRID_MODELS,
    SLIDING,
    STATE,
    HybridModel,
    LayerGroup,
    gated_delta_net_state_elements,
)
from course.hybrid_sizing import (
    attention_block_size,
    fit_table,
    group_bytes_per_token,
    page_bytes,
    request_bytes,
    requests_that_fit,
)
from course.hybrid_sizing import main as sizing_main

MODELS = list(HYBRID_MODELS.values())

# --- the published models follow the layer patterns their sources state --------------------

# (layers, which layer indices are the model's other kind): gpt-oss slides on even layers;
# Gemma 3 has a global (full) layer after every five local ones; Qwen3-Next a full layer
# after every three linear-attention ones.
PATTERNS = {
    "gpt-oss-120b": (36, SLIDING, lambda i: i % 2 == 0),
    "gpt-oss-20b": (24, SLIDING, lambda i: i % 2 == 0),
    "Gemma-3-27B": (62, SLIDING, lambda i: (i + 1) % 6 != 0),
    "Gemma-3-12B": (48, SLIDING, lambda i: (i + 1) % 6 != 0),
    "Qwen3-Next-80B-A3B": (48, STATE, lambda i: (i + 1) % 4 != 0),
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_models_groups_count_the_layers_its_pattern_gives(model):
    layers, kind, other = PATTERNS[model.name]
    counts = {g.kind: g.num_layers for g in model.groups}
    assert model.num_layers == layers
    assert counts[kind] == sum(1 for i in range(layers) if other(i))
    assert counts[FULL] == layers - counts[kind]


def test_a_gated_delta_net_state_is_its_convolution_and_recurrent_states():
    """vLLM's shapes (``gated_delta_net_state_shape``): a convolution state of
    (conv_kernel - 1, conv_dim) with conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim *
    num_v_heads, and a recurrent state of (num_v_heads, head_k_dim, head_v_dim)."""
    for k_heads, v_heads, k_dim, v_dim, kernel in [(16, 32, 128, 128, 4), (2, 4, 8, 16, 3),
                                                   (1, 1, 1, 1, 2)]:
        conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
        shapes = [(kernel - 1, conv_dim), (v_heads, k_dim, v_dim)]
        elements = sum(a * b * (c[0] if c else 1) for a, b, *c in shapes)
        assert gated_delta_net_state_elements(k_heads, v_heads, k_dim, v_dim, kernel) == elements


# --- sizing, against the layers one by one ---------------------------------------------------


def _layers(model: HybridModel) -> list[LayerGroup]:
    """Every layer of ``model``, as a group of one."""
    return [LayerGroup(g.kind, 1, g.num_kv_heads, g.head_dim, g.window, g.state_elements)
            for g in model.groups for _ in range(g.num_layers)]


def _held_by_layers(model: HybridModel, tokens: int, element: float) -> float:
    """Bytes a request holds, layer by layer: each attention layer keeps a key and a value of
    every KV head for each token its next query still sees (all, or the window's), each state
    layer its state once it has seen a token."""
    held = 0.0
    for layer in _layers(model):
        if layer.kind == STATE:
            held += layer.state_elements * element * (tokens > 0)
            continue
        first = 0 if layer.kind == FULL else max(0, tokens - layer.window)
        held += len(range(first, tokens)) * layer.num_kv_heads * layer.head_dim * 2 * element
    return held


CASES = [(model, tokens, element) for model in MODELS
         for tokens in (0, 1, 127, 128, 129, 1023, 1024, 1025, 8192, 131072)
         for element in (2, 1)]


@pytest.mark.parametrize(("model", "tokens", "element"), CASES,
                         ids=[f"{m.name}-{n}-{e}B" for m, n, e in CASES])
def test_a_request_holds_what_its_layers_keep_one_by_one(model, tokens, element):
    assert request_bytes(model, tokens, element) == _held_by_layers(model, tokens, element)
    per_token = sum(group_bytes_per_token(g, element) for g in model.groups)
    growth = _held_by_layers(model, tokens + 1, element) - _held_by_layers(model, tokens, element)
    if tokens:  # past the first token (which brings the states), at most a token's worth
        assert growth <= per_token


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_hybrid_model_fits_at_least_as_many_requests_as_all_full_attention(model):
    pool = 60 * 10**9
    for tokens in (8192, 32768, 131072):
        fit = requests_that_fit(model, pool, tokens)
        each = request_bytes(model, tokens)
        assert isinstance(fit, int) and fit * each <= pool < (fit + 1) * each
        assert fit >= requests_that_fit(model.all_full_attention(), pool, tokens)
    with pytest.raises(ValueError):
        requests_that_fit(model, pool, 0)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_every_group_fits_the_one_page_size(model, block_size):
    """The attention block size is the smallest multiple of ``block_size`` whose page (one
    block of one attention layer) holds a state layer's whole state, tried one multiple at a
    time."""
    attention = next(g for g in model.groups if g.kind != STATE)
    state = max((g.state_elements * 2 for g in model.groups if g.kind == STATE), default=0)
    multiple = 1
    while multiple * block_size * 2 * attention.num_kv_heads * attention.head_dim * 2 < state:
        multiple += 1
    assert attention_block_size(model, block_size) == multiple * block_size
    page = page_bytes(model, block_size)
    assert page >= state and all(
        page == attention_block_size(model, block_size) * group_bytes_per_token(g) / g.num_layers
        for g in model.groups if g.kind != STATE)


# --- a sliding window's blocks ---------------------------------------------------------------


def _seen(position: int, window: int | None) -> range:
    """The positions whose keys the query at ``position`` sees."""
    return range(0 if window is None else max(0, position - window + 1), position + 1)


@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_freed_blocks_are_exactly_those_the_next_token_never_sees(window, block_size):
    for computed in range(0, 30):
        table = list(range(1, -(-(computed + 1) // block_size) + 1))
        before = list(table)
        freed = free_skipped_blocks(table, computed, window, block_size)
        seen = set(_seen(computed, window))
        gone = [i for i in range(len(before))
                if not seen & set(range(i * block_size, (i + 1) * block_size))
                and (i + 1) * block_size <= computed]
        assert freed == [before[i] for i in gone]
        assert table == [NULL_BLOCK if i in gone else b for i, b in enumerate(before)]
        assert free_skipped_blocks(table, computed, window, block_size) == []  # once only
        assert skipped_tokens(computed, window) == min(seen)


@pytest.mark.parametrize("window", [None, 1, 3, 4, 7, 16])
@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_the_blocks_needed_hold_every_token_the_last_one_sees(window, block_size):
    for tokens in range(1, 40):
        seen = _seen(tokens - 1, window)
        wanted = sorted({p // block_size for p in seen})
        assert list(blocks_needed(tokens, window, block_size)) == wanted


# --- prefix hits, against every hit length tried ---------------------------------------------


def _accepts(cached: set[int], length: int, block_size: int, window: int | None) -> bool:
    """Whether a hit of ``length`` tokens lets the group compute on: every token the next
    query sees (all of them, or the window's before ``length``) is in a cached block."""
    before = range(0 if window is None else max(0, length - window + 1), length)
    return all(p // block_size in cached for p in before)


def _longest(groups: list[tuple[set[int], int | None]], max_length: int,
             block_size: int) -> int:
    return next(length for length in range(max_length // block_size * block_size, -1,
                                           -block_size)
                if all(_accepts(c, length, block_size, w) for c, w in groups))


def _random_cases(count: int, seed: int) -> list[tuple[list[tuple[set[int], int | None]],
                                                       int, int]]:
    """(groups, tokens, block size): random cached blocks, often in runs, per group."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        block_size = rng.choice([1, 2, 3, 4, 8])
        tokens = rng.randint(1, 60)
        blocks = -(-tokens // block_size)
        groups = []
        for _ in range(rng.randint(1, 3)):
            window = rng.choice([None, 1, 2, 3, 5, 8, 13])
            density = rng.random()
            groups.append(({i for i in range(blocks) if rng.random() < density}, window))
        cases.append((groups, tokens, block_size))
    return cases


def _disagreement(full: Callable, sliding: Callable, hybrid: Callable) -> str | None:
    """The first case where the three hits differ from the longest length tried one by one."""
    for groups, tokens, block_size in _random_cases(400, seed=10):
        max_length = tokens - 1
        for cached, window in groups:
            hit = (full(cached, max_length, block_size) if window is None
                   else sliding(cached, max_length, block_size, window))
            if hit != _longest([(cached, window)], max_length, block_size):
                return f"{window=}, {sorted(cached)=}, {max_length=}, {block_size=}: {hit}"
        hit = hybrid(groups, tokens, block_size)
        if hit != _longest(groups, max_length, block_size):
            return f"{groups=}, {tokens=}, {block_size=}: {hit}"
    return None


def test_each_groups_hit_and_the_hybrid_hit_are_the_longest_every_group_accepts():
    assert _disagreement(full_attention_hit, sliding_window_hit, hybrid_hit) is None


@pytest.mark.parametrize(("cached", "window", "hit"), [
    ({0, 1, 2, 3}, 9, 16),
    ({2, 3}, 9, 16),
    ({3}, 9, 0),
    ({0}, 9, 4),
    ({1, 2}, 9, 12),
    ({3}, 5, 16),
], ids=["all cached", "only the window's blocks", "one block of two", "a run from block 0",
        "the last run long enough", "a window of one block"])
def test_a_sliding_window_hit_needs_only_the_blocks_before_it(cached, window, hit):
    """17 tokens in blocks of 4: the hit stops before the last token, so at most 16 tokens;
    a window of 9 needs the 8 tokens before the hit (two blocks), a window of 5 the 4 (one)."""
    assert sliding_window_hit(cached, 16, 4, window) == hit
    assert _longest([(cached, window)], 16, 4) == hit


def _needs_a_whole_window(cached, max_length, block_size, window):
    needed = -(-window // block_size)  # off by one: the window's own token is not cached
    run = 0
    for block in range(max_length // block_size - 1, -1, -1):
        run = run + 1 if block in cached else 0
        if run == needed:
            return (block + needed) * block_size
    return run * block_size


def _forgets_the_run_from_block_zero(cached, max_length, block_size, window):
    hit = sliding_window_hit(cached, max_length, block_size, window)
    return hit if hit >= -(-(window - 1) // block_size) * block_size else 0


def _counts_cached_blocks_anywhere(cached, max_length, block_size):
    return min(len(cached), max_length // block_size) * block_size


def _one_pass(groups, tokens, block_size):
    length = (tokens - 1) // block_size * block_size
    for cached, window in reversed(groups):  # sliding first, then full: no second pass
        length = (full_attention_hit(cached, length, block_size) if window is None
                  else sliding_window_hit(cached, length, block_size, window))
    return length


def _computes_nothing_of_the_last_block(groups, tokens, block_size):
    length = tokens // block_size * block_size  # a request of whole blocks gets all of them
    return min(full_attention_hit(c, length, block_size) if w is None
               else sliding_window_hit(c, length, block_size, w) for c, w in groups)


@pytest.mark.parametrize(("full", "sliding", "hybrid"), [
    (full_attention_hit, _needs_a_whole_window, hybrid_hit),
    (full_attention_hit, _forgets_the_run_from_block_zero, hybrid_hit),
    (_counts_cached_blocks_anywhere, sliding_window_hit, hybrid_hit),
    (full_attention_hit, sliding_window_hit, _one_pass),
    (full_attention_hit, sliding_window_hit, _computes_nothing_of_the_last_block),
], ids=["window, not window - 1", "no run from block 0", "full: any cached blocks",
        "hybrid: one pass", "hybrid: the last token cached"])
def test_the_comparison_catches_wrong_hits(full, sliding, hybrid):
    assert _disagreement(full, sliding, hybrid) is not None


# --- one pool for every group ----------------------------------------------------------------


def _held(computed: int, reserved: int, window: int | None, block_size: int) -> int:
    """Blocks a group holds for a request with ``reserved`` tokens' room, ``computed`` of them
    computed: a slot per block of room, less those its window left behind."""
    slots = -(-reserved // block_size)
    left = 0 if window is None else min(skipped_tokens(computed, window) // block_size, slots)
    return slots - left


def _manager_disagreement(manager_class: type, trials: int = 150) -> str | None:
    """Drive ``manager_class`` with seeded random requests (new ones, steps of a few tokens,
    frees) and compare it, after every call, with a count of what each request must hold: a
    step succeeds exactly when its new blocks fit beside what everyone holds once the windows
    have let go; the null block is never handed out; the blocks held and the free ones are
    the pool, each once; a sliding table's null slots are exactly the blocks left behind."""
    rng = random.Random(7)
    for trial in range(trials):
        block_size = rng.choice([1, 2, 4])
        windows = rng.choice([[None], [3], [None, 4], [6, None], [None, 2, 9], [5, 5]])
        num_blocks = rng.randint(2, 30)
        manager = manager_class(num_blocks, block_size, windows)
        room: dict[int, int] = {}  # request -> tokens it has room for (all computed)
        seen: dict[int, int] = {}  # request -> tokens computed when its windows last slid
        for step in range(50):
            where = f"trial {trial}, step {step}, {block_size=}, {windows=}, {num_blocks=}"
            request = rng.randrange(6)
            if request in room and rng.random() < 0.15:
                manager.free(request)
                del room[request], seen[request]
            else:
                done = room.get(request, 0)
                new = rng.randint(1, 3 * block_size + 1)
                if request in room:
                    seen[request] = done
                held = sum(_held(seen[r], room[r], w, block_size)
                           for r in room for w in windows)
                needed = sum(-(-(done + new) // block_size) - -(-done // block_size)
                             for _ in windows)
                fits = needed <= num_blocks - 1 - held
                if manager.allocate_slots(request, done, new) != fits:
                    return f"{where}: allocate_slots of {new} tokens gave {not fits}"
                if fits:
                    room[request] = done + new
                    seen.setdefault(request, done)
            taken = [b for tables in manager.tables.values() for t in tables for b in t
                     if b != NULL_BLOCK]
            if sorted(taken + list(manager.free_blocks)) != list(range(1, num_blocks)):
                return f"{where}: held {sorted(taken)} and free {list(manager.free_blocks)}"
            if sorted(manager.tables) != sorted(room):
                return f"{where}: tables for {sorted(manager.tables)}, expected {sorted(room)}"
            for r, tokens in room.items():
                for table, window in zip(manager.tables[r], windows, strict=True):
                    left = 0 if window is None else min(
                        skipped_tokens(seen[r], window) // block_size, len(table))
                    nulls = [i for i, b in enumerate(table) if b == NULL_BLOCK]
                    if len(table) != -(-tokens // block_size) or nulls != list(range(left)):
                        return f"{where}: request {r} ({tokens} tokens) holds {table} ({window=})"
    return None


def test_one_pool_serves_every_group_all_or_none():
    assert _manager_disagreement(HybridBlockManager) is None


class _TakesWhatItCan(HybridBlockManager):
    def allocate_slots(self, request, num_computed, num_new):
        fits = super().allocate_slots(request, num_computed, num_new)
        if not fits:  # hands out what is left to the first groups
            tables = self.tables.setdefault(request, [[] for _ in self.windows])
            needed = self.blocks_to_allocate(request, num_computed + num_new)
            for table, count in zip(tables, needed, strict=True):
                while count and self.free_blocks:
                    table.append(self.free_blocks.popleft())
                    count -= 1
        return fits


class _NeverSlides(HybridBlockManager):
    def __init__(self, num_blocks, block_size, windows):
        super().__init__(num_blocks, block_size, [None] * len(windows))


class _FreesTheNullBlock(HybridBlockManager):
    def free(self, request):
        for table in self.tables.pop(request, []):
            self.free_blocks.extend(reversed(table))


class _CountsOnlyTheFirstGroup(HybridBlockManager):
    def allocate_slots(self, request, num_computed, num_new):
        for table, window in zip(self.tables.get(request, [[]] * len(self.windows)),
                                 self.windows, strict=True):
            if window is not None:
                self.free_blocks.extend(free_skipped_blocks(table, num_computed, window,
                                                            self.block_size))
        needed = self.blocks_to_allocate(request, num_computed + num_new)
        if needed[0] > len(self.free_blocks):
            return False
        tables = self.tables.setdefault(request, [[] for _ in self.windows])
        for table, count in zip(tables, needed, strict=True):
            table.extend(self.free_blocks.popleft() for _ in range(min(count,
                                                                       len(self.free_blocks))))
        return True


@pytest.mark.parametrize("manager_class", [_TakesWhatItCan, _NeverSlides, _FreesTheNullBlock,
                                           _CountsOnlyTheFirstGroup],
                         ids=["not all or none", "never frees a window's blocks",
                              "frees the null block", "counts one group's blocks"])
def test_the_pool_comparison_catches_wrong_managers(manager_class):
    assert _manager_disagreement(manager_class) is not None


def test_the_fit_table_is_each_model_at_each_length_hybrid_and_all_full():
    lengths = [8192, 131072]
    rows = fit_table(MODELS, 40 * 2**30, lengths)
    assert [(name, length) for name, length, _, _ in rows] == \
        [(m.name, n) for m in MODELS for n in lengths]
    for (_, length, hybrid, full), model in zip(rows, [m for m in MODELS for _ in lengths],
                                                strict=True):
        assert hybrid == requests_that_fit(model, 40 * 2**30, length)
        assert full == requests_that_fit(model.all_full_attention(), 40 * 2**30, length)
        assert hybrid >= full


def test_the_printed_fit_table_is_fit_table(capsys):
    sizing_main(pool_gib=40, lengths=(8192,))
    rows = [row.split() for row in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [[name, str(length), str(hybrid), str(full)] for name, length, hybrid, full
                    in fit_table(MODELS, 40 * 2**30, [8192])]


@pytest.mark.parametrize(("arguments", "allocation"), [
    ((1, 4, [None]), None), ((8, 0, [None]), None), ((8, 4, []), None),
    ((8, 4, [0, None]), None), ((8, 4, [None]), (0, -1, 2)), ((8, 4, [3]), (0, 2, 0)),
], ids=["no block beside the null one", "blocks of 0 tokens", "no group", "a window of 0",
        "tokens computed below 0", "no new token"])
def test_a_pool_or_a_step_that_cannot_be_is_refused(arguments, allocation):
    with pytest.raises(ValueError):
        manager = HybridBlockManager(*arguments)
        manager.allocate_slots(*allocation)
