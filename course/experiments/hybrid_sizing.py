"""Sizing a hybrid model's cache: what a request holds in each group, how many requests a pool
holds, and the block size that gives every group the same page.

A request of n tokens, per kind of layer (``course.experiments.hybrid_models``)::

    bytes
      ^                                   full attention: grows with every token
      |                              ___/
      |                         ___/
      |                    ___/
      |               ___/ ________________  sliding window: stops growing at the window
      |          ___/_/
      |     ___//
      |____//_____________________________  state: one fixed state from the first token on
      +---------------------------------------> n tokens
                 window

One pool serves every group, in pages of one size (vLLM's hybrid KV cache manager): a page
holds one block of one layer. Attention layers of different shapes get different block sizes
so that their pages match; a state layer's page holds its whole state, and the attention
layers' block size is raised until their page is at least that big (the state is padded to
it).
"""

from __future__ import annotations

from collections.abc import Callable

from course.experiments.hybrid_models import FULL, SLIDING, STATE, HybridModel, LayerGroup
from course.v1.hybrid_cache import blocks_needed


def group_bytes_per_token(group: LayerGroup, bytes_per_element: float = 2) -> float:
    """Bytes one more token adds to a group's cache, in all its layers: a key and a value
    per KV head in every attention layer; nothing in a state layer, whose state does not
    grow."""
    if group.kind == STATE:
        return 0
    return 2 * group.num_layers * group.num_kv_heads * group.head_dim * bytes_per_element


def request_bytes(model: HybridModel, num_tokens: int, bytes_per_element: float = 2) -> float:
    """Bytes a request of ``num_tokens`` tokens holds in ``model``'s cache, every group
    together (``model.groups``):

    * a full-attention group (``group.kind == FULL``) keeps every token:
      ``group_bytes_per_token(group, bytes_per_element)`` per token;
    * a sliding-window group (``SLIDING``) keeps at most its ``group.window`` last tokens;
    * a state group (``STATE``) keeps one state of ``group.state_elements`` elements in each
      of its ``group.num_layers`` layers, however many tokens it has seen, and none before
      the first token.
    """
    ### BEGIN SOLUTION
    total = 0.0
    for group in model.groups:
        if group.kind == FULL:
            total += num_tokens * group_bytes_per_token(group, bytes_per_element)
        elif group.kind == SLIDING:
            total += min(num_tokens, group.window) * group_bytes_per_token(group,
                                                                            bytes_per_element)
        elif num_tokens > 0:
            total += group.num_layers * group.state_elements * bytes_per_element
    return total
    ### END SOLUTION


# what sizes a request: (model, num_tokens, bytes_per_element) -> bytes
Sizing = Callable[[HybridModel, int, float], float]


def requests_that_fit(model: HybridModel, pool_bytes: float, num_tokens: int,
                      bytes_per_element: float = 2, sizing: Sizing = request_bytes) -> int:
    """How many requests of ``num_tokens`` tokens each ``pool_bytes`` of cache holds at
    once (whole requests: an ``int``), each of ``sizing(model, num_tokens,
    bytes_per_element)`` bytes (``request_bytes``, or a learner's). A request of no tokens
    holds nothing, so the count has no bound: ``ValueError``."""
    each = sizing(model, num_tokens, bytes_per_element)
    if each == 0:
        raise ValueError("a request that holds no cache puts no bound on how many fit")
    return int(pool_bytes // each)


def attention_block_size(model: HybridModel, block_size: int, bytes_per_element: float = 2
                         ) -> int:
    """The tokens per block of ``model``'s attention layers that make one page, in bytes, at
    least as big as a state layer's whole state: the smallest multiple of ``block_size`` that
    does (vLLM aligns a block to its kernels' block size), ``block_size`` itself when the model
    has no state layer. Its attention layers all have one shape."""
    per_token = _attention_layer_token_bytes(model, bytes_per_element)
    state = max((g.state_elements * bytes_per_element for g in model.groups
                 if g.kind == STATE), default=0)
    blocks = max(1, -(-state // (block_size * per_token)))
    return int(blocks * block_size)


def page_bytes(model: HybridModel, block_size: int, bytes_per_element: float = 2) -> int:
    """Bytes of one page of ``model``'s pool: one block of one attention layer at
    ``attention_block_size``, which a state layer's state (padded) fits in."""
    tokens = attention_block_size(model, block_size, bytes_per_element)
    return int(_attention_layer_token_bytes(model, bytes_per_element) * tokens)


def _attention_layer_token_bytes(model: HybridModel, bytes_per_element: float) -> float:
    """Bytes one token takes in one of ``model``'s attention layers (all of one shape)."""
    attention = next(g for g in model.groups if g.kind != STATE)
    return group_bytes_per_token(attention, bytes_per_element) / attention.num_layers


def request_pages(model: HybridModel, num_tokens: int, block_size: int = 16,
                  bytes_per_element: float = 2) -> int:
    """Pages a request of ``num_tokens`` tokens holds in ``model``'s pool, whose pages are
    ``page_bytes``: in each attention layer, the blocks of ``attention_block_size`` tokens it
    must hold (``course.v1.hybrid_cache.blocks_needed``: every one under full attention, from
    its window's first one under a sliding window), the last one partly filled; in each state
    layer one page, its state padded to it; nothing before the first token."""
    tokens = attention_block_size(model, block_size, bytes_per_element)
    pages = 0
    for group in model.groups:
        if group.kind == STATE:
            pages += group.num_layers if num_tokens else 0
        else:
            pages += group.num_layers * len(blocks_needed(num_tokens, group.window, tokens))
    return pages


def fit_table(models: list[HybridModel], pool_bytes: float, lengths: list[int],
              bytes_per_element: float = 2, sizing: Sizing = request_bytes,
              block_size: int = 16) -> list[tuple[str, int, int, int, int]]:
    """(model, tokens per request, requests that fit, requests that fit in whole pages,
    requests that fit were every layer full attention) for each model and length, in a pool
    of ``pool_bytes`` bytes of cache, each request sized by ``sizing``; in whole pages, the
    pool's ``pool_bytes // page_bytes`` pages over ``request_pages`` (kernel blocks of
    ``block_size``)."""
    return [(model.name, length,
             requests_that_fit(model, pool_bytes, length, bytes_per_element, sizing),
             int(pool_bytes // page_bytes(model, block_size, bytes_per_element))
             // request_pages(model, length, block_size, bytes_per_element),
             requests_that_fit(model.all_full_attention(), pool_bytes, length,
                               bytes_per_element, sizing))
            for model in models for length in lengths]


def main(pool_gib: float = 40, lengths: tuple[int, ...] = (8192, 32768, 131072)) -> None:
    """Print ``fit_table`` for the published hybrid models in a ``pool_gib`` GiB pool (bf16)."""
    from course.experiments.hybrid_models import HYBRID_MODELS

    print(f"requests that fit in {pool_gib:g} GiB of KV cache (bf16): "
          f"`python -m course.experiments.hybrid_sizing`")
    print(f"{'model':<22}{'tokens':>8}{'hybrid':>8}{'in pages':>10}{'all full':>10}")
    for name, length, hybrid, pages, full in fit_table(list(HYBRID_MODELS.values()),
                                                       pool_gib * 2**30, list(lengths)):
        print(f"{name:<22}{length:>8}{hybrid:>8}{pages:>10}{full:>10}")


if __name__ == "__main__":
    main()
