"""Each chapter's parts, named once; everything else looks a chapter up here.

``answers`` maps a solution cell's grade id to where its code is written in the library:
``"module"`` (the cell's functions are that module's) or ``"module:Class"`` (they are that
class's methods). A solution cell not named here is written in the notebook alone (chapter
3's first ``append_slot``, which a later TODO replaces). ``skeleton`` is the class a locked
``skeleton`` cell gives: the library class less every method that holds an answer. Which
chapters' answers a chapter runs is computed from the code (``autograder.builder.needs``).

The modules and files of a chapter are named after its number: ``checks``, ``hidden``,
``mutants``, ``alternatives`` and ``tests`` of its ``Parts`` give their names; nothing else
spells them (``parts_of(3).hidden`` is ``"autograder.hidden.ch03"``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parts:
    slug: str
    answers: dict[str, str]
    skeleton: str | None = None

    @property
    def number(self) -> int:
        return int(self.slug[:2])

    @property
    def checks(self) -> str:
        """The module of the visible checks."""
        return f"autograder.checks.{self._ch}"

    @property
    def hidden(self) -> str:
        """The module of the hidden checks, oracles and models."""
        return f"autograder.hidden.{self._ch}"

    @property
    def mutants(self) -> str:
        """The module of wrong answers, each with its hint, in the course's test suite (which
        imports it with its own folder on the path)."""
        return f"mutants.{self._ch}"

    @property
    def alternatives(self) -> str:
        """The module of differently written correct answers, in the course's test suite."""
        return f"alternatives.{self._ch}"

    @property
    def tests(self) -> str:
        """The chapter's own test files, a glob pattern from the open course's root: every
        test about one chapter is named ``test_chNN_<topic>.py``."""
        return f"tests/test_{self._ch}_*.py"

    @property
    def _ch(self) -> str:
        return f"ch{self.slug[:2]}"


def _all(module: str, *grade_ids: str) -> dict[str, str]:
    return dict.fromkeys(grade_ids, module)


PARTS = {parts.slug: parts for parts in [
    Parts("01_kv_cache_sizing", _all(
        "course.experiments.kv_sizing", "kv_bytes_per_token", "mla_kv_bytes_per_token",
        "kv_bytes_per_sequence", "num_gpu_blocks", "requests_fit_contiguous",
        "requests_fit_paged")),
    Parts("02_fragmentation_and_block_tables", _all(
        "course.v0.block_tables", "blocks_needed", "locate", "slot_id", "slot_mapping",
        "last_block_waste", "contiguous_utilisation", "paged_utilisation")),
    Parts("03_block_manager", _all(
        "course.v0.block_manager:BlockManager", "allocate", "fork", "copy_on_write", "free"),
        skeleton="course.v0.block_manager:BlockManager"),
    Parts("04_prefix_caching", _all("course.v0.prefix_cache", "block_key", "prefix_keys") | _all(
        "course.v0.prefix_cache:PrefixCachingBlockManager", "take_block", "allocate",
        "append_slot", "free"), skeleton="course.v0.prefix_cache:PrefixCachingBlockManager"),
    Parts("05_scheduling_and_continuous_batching", _all(
        "course.v0.scheduler:Scheduler", "admit", "reserve_decode_slots", "preempt", "swap_in"),
        skeleton="course.v0.scheduler:Scheduler"),
    Parts("06_paged_kv_in_pytorch", _all(
        "kernels.paged_attention_ref", "write_kv", "paged_decode_attention", "merge_partials",
        "blockwise_decode_attention", "decode_step")),
    Parts("07_triton_paged_attention", _all(
        "kernels.paged_attention_steps", "one_block_kernel", "block_loop_kernel",
        "gqa_kernel") | _all("kernels.paged_attention", "paged_attention_kernel",
                             "paged_attention") | _all(
        "kernels.split_kv", "split_kv_kernel", "merge_splits_kernel")),
    Parts("08_capstone_paged_serving", _all(
        "course.v0.paged_engine", "build_decode_batch", "paged_decode_step", "serve", "abort",
        "decode_surviving_faults")),
    Parts("09_chunked_prefill", _all("course.v1.chunked_scheduler", "schedule_step") | _all(
        "kernels.varlen_attention_ref", "varlen_paged_attention") | _all(
        "kernels.varlen_attention", "varlen_attention_kernel") | _all(
        "course.v1.chunked_engine", "engine_step")),
    Parts("10_hybrid_models", _all("course.experiments.hybrid_sizing", "request_bytes") | _all(
        "course.v1.hybrid_cache", "free_skipped_blocks", "sliding_window_hit", "hybrid_hit") | _all(
        "kernels.sliding_window_attention", "window_first_key")),
    Parts("11_kv_beyond_one_gpu", _all(
        "course.v1.offloading_connector:OffloadingConnectorScheduler", "get_num_new_matched_tokens",
        "build_connector_meta") | _all("course.v1.connector_engine", "admit_with_connector"),
        skeleton="course.v1.offloading_connector:OffloadingConnectorScheduler"),
    Parts("12_speculative_decoding", _all("course.v1.spec_decode", "ngram_propose",
                                          "accept_greedy", "schedule_lookahead", "rollback")),
    Parts("13_compressed_kv", _all("course.v1.kv_quant", "kv_scale", "quantize_fp8") | _all(
        "course.v1.mla_engine", "absorbed_decode") | _all(
        "kernels.latent_record", "pack_latent_fp8") | _all("kernels.mla_decode", "e4m3_to_float")),
    Parts("14_fleet_of_engines", _all(
        "course.v1.block_hash", "hash_block_tokens", "request_block_hashes") | _all(
        "course.v1.kv_indexer:KVIndexer", "apply_batch", "overlap_blocks") | _all(
        "course.v1.kv_router", "choose_engine"), skeleton="course.v1.kv_indexer:KVIndexer"),
]}


def parts_of(number: int | str) -> Parts:
    """The parts of chapter ``number`` (``3`` or ``"03"``)."""
    return next(parts for parts in PARTS.values() if parts.number == int(number))
