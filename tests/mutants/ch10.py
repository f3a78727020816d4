"""Wrong chapter 10 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

from course.experiments.hybrid_models import FULL, STATE
from course.experiments.hybrid_sizing import group_bytes_per_token
from course.v1.hybrid_cache import NULL_BLOCK, full_attention_hit, skipped_tokens
from mutants import Rule, kernel_mutant


def _named(name: str, fn):
    fn.__name__ = name
    return fn


# --- request_bytes ----------------------------------------------------------------------------


def _bytes_with(sliding_kept=lambda n, window: min(n, window),
                states=lambda layers, elements, n: layers * elements if n else 0):
    """``request_bytes`` with a sliding group keeping ``sliding_kept(n, window)`` tokens and a
    state group ``states(num_layers, state_elements, n)`` elements."""

    def request_bytes(model, num_tokens, bytes_per_element=2):
        total = 0.0
        for group in model.groups:
            if group.kind == STATE:
                total += states(group.num_layers, group.state_elements, num_tokens) \
                    * bytes_per_element
            else:
                kept = num_tokens if group.kind == FULL else sliding_kept(num_tokens,
                                                                          group.window)
                total += kept * group_bytes_per_token(group, bytes_per_element)
        return total

    return request_bytes


_sliding_as_full = _named("_sliding_as_full", _bytes_with(sliding_kept=lambda n, window: n))
_window_less_one = _named("_window_less_one",
                          _bytes_with(sliding_kept=lambda n, window: min(n, window - 1)))
_no_state = _named("_no_state", _bytes_with(states=lambda layers, elements, n: 0))
_state_per_token = _named("_state_per_token",
                          _bytes_with(states=lambda layers, elements, n: n * layers * elements))
_state_before_the_first_token = _named("_state_before_the_first_token",
                                       _bytes_with(states=lambda layers, elements, n:
                                                   layers * elements))
_one_state_per_group = _named("_one_state_per_group",
                              _bytes_with(states=lambda layers, elements, n:
                                          elements if n else 0))


# --- free_skipped_blocks ----------------------------------------------------------------------


def _frees_partial_blocks(table, num_computed, window, block_size):
    whole = min(-(-skipped_tokens(num_computed, window) // block_size), len(table))
    freed = [b for b in table[:whole] if b != NULL_BLOCK]
    table[:whole] = [NULL_BLOCK] * whole
    return freed


def _window_of_the_last_token(table, num_computed, window, block_size):
    whole = min(max(0, num_computed - window) // block_size, len(table))
    freed = [b for b in table[:whole] if b != NULL_BLOCK]
    table[:whole] = [NULL_BLOCK] * whole
    return freed


def _shortens_the_table(table, num_computed, window, block_size):
    whole = min(skipped_tokens(num_computed, window) // block_size, len(table))
    freed = [b for b in table[:whole] if b != NULL_BLOCK]
    del table[:whole]
    return freed


def _frees_the_null_block(table, num_computed, window, block_size):
    whole = min(skipped_tokens(num_computed, window) // block_size, len(table))
    freed = table[:whole]
    table[:whole] = [NULL_BLOCK] * whole
    return freed


def _new_table_not_the_given_one(table, num_computed, window, block_size):
    whole = min(skipped_tokens(num_computed, window) // block_size, len(table))
    freed = [b for b in table[:whole] if b != NULL_BLOCK]
    table = [NULL_BLOCK] * whole + table[whole:]  # a new list: the caller's is unchanged
    return freed


def _stops_at_the_first_null(table, num_computed, window, block_size):
    freed = []
    for index in range(min(skipped_tokens(num_computed, window) // block_size, len(table)) - 1,
                       -1, -1):
        if table[index] == NULL_BLOCK:
            break  # as if nulls only ever stood at the front
        freed.insert(0, table[index])
        table[index] = NULL_BLOCK
    return freed


def _returns_nothing(table, num_computed, window, block_size):
    whole = min(skipped_tokens(num_computed, window) // block_size, len(table))
    table[:whole] = [NULL_BLOCK] * whole


# --- sliding_window_hit -----------------------------------------------------------------------


def _reads_left_to_right(cached, max_length, block_size, window):
    return full_attention_hit(cached, max_length, block_size)


def _right_to_left_needing(needed_blocks):
    def sliding_window_hit(cached, max_length, block_size, window):
        needed = needed_blocks(window, block_size)
        run = 0
        for block in range(max_length // block_size - 1, -1, -1):
            run = run + 1 if block in cached else 0
            if run == needed:
                return (block + needed) * block_size
        return run * block_size
    return sliding_window_hit


_window_in_whole_blocks = _right_to_left_needing(lambda w, b: w // b)
_window_in_whole_blocks.__name__ = "_window_in_whole_blocks"
_window_rounded_up = _right_to_left_needing(lambda w, b: -(-w // b))
_window_rounded_up.__name__ = "_window_rounded_up"
_no_case_for_a_window_of_one = _right_to_left_needing(lambda w, b: -(-(w - 1) // b))
_no_case_for_a_window_of_one.__name__ = "_no_case_for_a_window_of_one"


def _no_short_run_from_block_0(cached, max_length, block_size, window):
    needed = -(-(window - 1) // block_size)
    if needed == 0:
        return max_length // block_size * block_size
    run = 0
    for block in range(max_length // block_size - 1, -1, -1):
        run = run + 1 if block in cached else 0
        if run == needed:
            return (block + needed) * block_size
    return 0


def _first_run_from_the_left(cached, max_length, block_size, window):
    needed = -(-(window - 1) // block_size)
    if needed == 0:
        return max_length // block_size * block_size
    run = 0
    for block in range(max_length // block_size):
        run = run + 1 if block in cached else 0
        if run == needed:
            return (block + 1) * block_size
    return full_attention_hit(cached, max_length, block_size)


def _hit_in_blocks(cached, max_length, block_size, window):
    needed = -(-(window - 1) // block_size)
    if needed == 0:
        return max_length // block_size
    run = 0
    for block in range(max_length // block_size - 1, -1, -1):
        run = run + 1 if block in cached else 0
        if run == needed:
            return block + needed
    return run


# --- hybrid_hit -------------------------------------------------------------------------------


def _one_group_hit(cached, length, block_size, window):
    from course.v1.hybrid_cache import sliding_window_hit

    return (full_attention_hit(cached, length, block_size) if window is None
            else sliding_window_hit(cached, length, block_size, window))


def _least_of_the_groups(groups, num_tokens, block_size):
    length = (num_tokens - 1) // block_size * block_size
    return min(_one_group_hit(cached, length, block_size, window) for cached, window in groups)


def _one_pass(groups, num_tokens, block_size):
    length = (num_tokens - 1) // block_size * block_size
    for cached, window in groups:
        length = _one_group_hit(cached, length, block_size, window)
    return length


def _last_token_hit_too(groups, num_tokens, block_size):
    length = num_tokens // block_size * block_size
    while True:
        shortest = length
        for cached, window in groups:
            shortest = _one_group_hit(cached, shortest, block_size, window)
        if shortest == length:
            return length
        length = shortest


def _full_attention_groups_only(groups, num_tokens, block_size):
    length = (num_tokens - 1) // block_size * block_size
    return min([full_attention_hit(cached, length, block_size)
                for cached, window in groups if window is None] or [length])


# --- window_first_key -------------------------------------------------------------------------

def _first_key(name: str, new: str):
    """The course's ``window_first_key`` returning ``new``, renamed ``name``."""
    from kernels.sliding_window_attention import window_first_key

    return kernel_mutant(window_first_key, name, "tl.maximum(context - window, 0)", new)


def _first_keys() -> list:
    return [
        (_first_key("every_earlier_key", "context * 0"), "never before the window"),
        (_first_key("window_one_short", "tl.maximum(context - window + 1, 0)"),
         "It matches each query seeing window - 1 keys"),
        (_first_key("window_one_long", "tl.maximum(context - window - 1, 0)"),
         "never before the window"),
        (_first_key("below_zero_for_a_short_request", "context - window"), "never below 0"),
        (_first_key("the_smaller_of_the_two", "tl.minimum(context - window, 0)"),
         "never before the window"),
    ]


MUTANTS = {
    "request_bytes": [
        (_sliding_as_full, "its cost stops growing at the window"),
        (_no_state, "A state layer keeps one fixed-size state per request"),
        (_state_per_token, "A state does not grow with the request"),
        (_state_before_the_first_token, "A request of no tokens has no state yet"),
        (_one_state_per_group, "Every layer of a state group keeps a state of its own"),
        (_window_less_one, "at most the window's last tokens"),
    ],
    "free_skipped_blocks": [
        (_frees_partial_blocks, "a block the window still partly sees is needed"),
        (_window_of_the_last_token, "the first num_computed - window + 1 are out"),
        (_shortens_the_table, "The table keeps its length"),
        (_frees_the_null_block, "the null block is never freed"),
        (_new_table_not_the_given_one, "The table itself changes"),
        (_returns_nothing, "(Shown: the blocks returned, then the table after the call.)"),
        (_stops_at_the_first_null, "wherever a null block stands among them"),
    ],
    "sliding_window_hit": [
        (_reads_left_to_right, "That is full attention's hit"),
        (_window_in_whole_blocks, "not window // block_size"),
        (_window_rounded_up, "not ceil(window / block_size)"),
        (_no_case_for_a_window_of_one, "A sliding window accepts a hit of L tokens"),
        (_no_short_run_from_block_0, "reaches block 0 is a hit however short"),
        (_first_run_from_the_left, "the longest hit is the last run, not the first"),
        (_hit_in_blocks, "A sliding window accepts a hit of L tokens"),
    ],
    "hybrid_hit": [
        (_least_of_the_groups, "ask again at the shorter length"),
        (_one_pass, "until a whole pass changes nothing"),
        (_last_token_hit_too, "The last token is always computed"),
        (_full_attention_groups_only, "Every group must accept the hit"),
    ],
    "window_first_key": _first_keys(),
}

RULES = [
    Rule("sliding window: at most its last window tokens, min(n, window) x "
         "group_bytes_per_token(group): the cost stops growing at the window", "request_bytes",
         ("_sliding_as_full", "_window_less_one")),
    Rule("state: one state of state_elements elements in each of its layers from the first "
         "token on, num_layers x state_elements x bytes_per_element, and nothing for a "
         "request of no tokens.", "request_bytes",
         ("_no_state", "_state_per_token", "_state_before_the_first_token",
          "_one_state_per_group")),
    Rule("A block all of whose tokens are skipped goes back to the pool", "free_skipped_blocks",
         ("_frees_partial_blocks",)),
    Rule("no longer sees the first skipped_tokens(n, window) = max(0, n - window + 1) of them",
         "free_skipped_blocks", ("_window_of_the_last_token",)),
    Rule("its slot in the table keeps its place with the null block (block 0 of the pool, "
         "never handed out), so that a logical block's index still names the same tokens",
         "free_skipped_blocks", ("_shortens_the_table",)),
    Rule("A slot that already holds the null block gives nothing back.", "free_skipped_blocks",
         ("_frees_the_null_block",)),
    Rule("in place of every block whose tokens the window no longer sees",
         "free_skipped_blocks", ("_stops_at_the_first_null",)),
    Rule("it changes the table itself and returns the blocks it took out, in table order.",
         "free_skipped_blocks", ("_new_table_not_the_given_one", "_returns_nothing")),
    Rule("a sliding window reads only the window - 1 tokens before L: it needs the ceil((window "
         "- 1) / block_size) blocks just before L cached", "sliding_window_hit",
         ("_window_in_whole_blocks", "_window_rounded_up")),
    Rule("found by reading right to left from the last whole block within max_length",
         "sliding_window_hit", ("_reads_left_to_right", "_first_run_from_the_left")),
    Rule("A run of cached blocks that reaches block 0 is a hit too, however short (nothing "
         "before it is missing)", "sliding_window_hit", ("_no_short_run_from_block_0",)),
    Rule("with a window of one token, nothing before L is needed.", "sliding_window_hit",
         ("_no_case_for_a_window_of_one",)),
    Rule("The longest prefix hit, in tokens", "sliding_window_hit", ("_hit_in_blocks",)),
    Rule("a group's answer depends on the length it is asked about", "hybrid_hit",
         ("_least_of_the_groups",)),
    Rule("stop when a whole pass over the groups shortens it no more", "hybrid_hit",
         ("_one_pass",)),
    Rule("its last token is always computed, chapter 4's rule: at most the last whole block "
         "before it", "hybrid_hit", ("_last_token_hit_too",)),
    Rule("A hybrid model's hit must hold in every group", "hybrid_hit",
         ("_full_attention_groups_only",)),
    Rule("the window holds window keys, its own included", "window_first_key",
         ("window_one_short", "window_one_long")),
    Rule("sees only its last window keys", "window_first_key",
         ("every_earlier_key", "the_smaller_of_the_two")),
    Rule("or 0 while the request is shorter than its window", "window_first_key",
         ("below_zero_for_a_short_request",)),
]
