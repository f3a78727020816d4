"""A hybrid model's cache, sized and kept (``course.experiments.hybrid_models``,
``course.experiments.hybrid_sizing``, ``course.v1.hybrid_cache``): the published models against
their sources' layer patterns, a request's bytes against its layers one by one, a window's blocks
against the positions its next token sees, the page size and the fit table; a KV cache or a step
that cannot be is refused (``course.v1.hybrid_coordinator``; its rules are
``tests/test_kv_coordinator.py``'s). The TODOs' answers (the blocks skipped, the hits) are held to
the chapter's hidden checks, whose oracles and mutants ``tests/test_checks.py`` and
``tests/test_grading.py`` run.
"""

from __future__ import annotations

import pytest

from course.experiments.hybrid_models import (
    FULL,
    HYBRID_MODELS,
    SLIDING,
    STATE,
    HybridModel,
    LayerGroup,
    gated_delta_net_state_elements,
)
from course.experiments.hybrid_sizing import (
    attention_block_size,
    fit_table,
    group_bytes_per_token,
    page_bytes,
    request_bytes,
    request_pages,
    requests_that_fit,
)
from course.experiments.hybrid_sizing import main as sizing_main
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.hybrid_cache import (
    NULL_BLOCK,
    blocks_needed,
    free_skipped_blocks,
    skipped_tokens,
)
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator

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


# --- the fit table and refusals -------------------------------------------------------------


def test_the_fit_table_is_each_model_at_each_length_hybrid_and_all_full():
    lengths = [8192, 131072]
    rows = fit_table(MODELS, 40 * 2**30, lengths)
    assert [(name, length) for name, length, *_ in rows] == \
        [(m.name, n) for m in MODELS for n in lengths]
    for (_, length, hybrid, pages, full), model in zip(
            rows, [m for m in MODELS for _ in lengths], strict=True):
        assert hybrid == requests_that_fit(model, 40 * 2**30, length)
        assert full == requests_that_fit(model.all_full_attention(), 40 * 2**30, length)
        assert hybrid >= full and pages <= hybrid  # whole pages hold a little less


def test_whole_pages_are_counted_block_by_block_and_state_by_padded_state():
    """Qwen3-Next's attention blocks are 544 tokens (a page holds a whole state): at 8,192
    tokens its 12 full-attention layers hold 16 pages each (the last partly empty) and its 36
    state layers a page each: 228 pages of 1,114,112 bytes, so 40 GiB holds 169 requests, not
    the 178 the exact bytes give. A sliding window's blocks are those its last token sees."""
    qwen = HYBRID_MODELS["Qwen3-Next-80B-A3B"]
    assert attention_block_size(qwen, 16) == 544 and page_bytes(qwen, 16) == 1_114_112
    assert request_pages(qwen, 8192) == 12 * 16 + 36 and request_pages(qwen, 0) == 0
    row = fit_table([qwen], 40 * 2**30, [8192])[0]
    assert row[2:4] == (178, 40 * 2**30 // 1_114_112 // 228) == (178, 169)
    gpt = HYBRID_MODELS["gpt-oss-120b"]  # 18 sliding layers (window 128), 18 full, blocks of 16
    # at 1,000 tokens: 63 blocks in a full layer; the last token (999) sees 872..999, blocks
    # 54 to 62 in a sliding one
    assert request_pages(gpt, 1000) == 18 * 63 + 18 * 9


def test_the_printed_fit_table_is_fit_table(capsys):
    sizing_main(pool_gib=40, lengths=(8192,))
    rows = [row.split() for row in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [[name, str(length), str(hybrid), str(pages), str(full)]
                    for name, length, hybrid, pages, full
                    in fit_table(MODELS, 40 * 2**30, [8192])]


@pytest.mark.parametrize(("arguments", "allocation"), [
    ((1, 4, [None]), None), ((8, 0, [None]), None), ((8, 4, []), None),
    ((8, 4, [0, None]), None), ((8, 4, [None]), (-1, 2)), ((8, 4, [3]), (2, 0)),
], ids=["no block beside the null one", "blocks of 0 tokens", "no group", "a window of 0",
        "tokens computed below 0", "no new token"])
def test_a_pool_or_a_step_that_cannot_be_is_refused(arguments, allocation):
    with pytest.raises(ValueError):
        kv = HybridKVCacheCoordinator(*arguments)
        computed, num_new = allocation
        kv.allocate_slots(ChunkedRequest(0, list(range(8)), 1, num_computed_tokens=computed),
                          num_new)
