"""Chapter 14's block hash is one hash everywhere: the course's (Python, cbor2) agrees byte for
byte with a second implementation written from vLLM's description in another language
(``tests/block_hash.mjs``: JavaScript under Node.js, its own CBOR encoder), and with fresh
interpreters whose ``hash()`` is seeded differently; a wrong seed, field order, encoding or
placement of the extra keys is caught by the same comparison."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.v1.block_hash import none_hash, request_block_hashes, sha256_cbor

NODE = shutil.which("node")
SCRIPT = Path(__file__).with_name("block_hash.mjs")
needs_node = pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                                reason="Node.js runs the second implementation (CI has it)")

names = st.none() | st.text(min_size=1, max_size=6)
CASES = st.fixed_dictionaries({
    "tokens": st.lists(st.integers(0, 2**33) | st.integers(0, 300), max_size=40),
    "block_size": st.integers(1, 8),
    "seed": st.text(max_size=5),
    "lora_name": names,
    "cache_salt": names,
})
FIXED = [  # CBOR's length boundaries: 23/24, 255/256, 65535/65536, 2**32
    {"tokens": [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**33],
     "block_size": 2, "seed": "0", "lora_name": None, "cache_salt": None},
    {"tokens": list(range(64)), "block_size": 16, "seed": "0", "lora_name": "adapter-1",
     "cache_salt": "tenant-a"},
    {"tokens": list(range(5)), "block_size": 16, "seed": "0", "lora_name": None,
     "cache_salt": "salt"},
    {"tokens": [7] * 48, "block_size": 16, "seed": "租户", "lora_name": "ß", "cache_salt": "盐"},
]


def course_hashes(case: dict, hasher=request_block_hashes, first=none_hash) -> list[str]:
    return [h.hex() for h in hasher(case["tokens"], case["block_size"], first(case["seed"]),
                                    lora_name=case["lora_name"], cache_salt=case["cache_salt"])]


def node_hashes(cases: list[dict]) -> list[list[str]]:
    if NODE is None:
        pytest.fail("CI must run the second implementation: install nodejs")
    done = subprocess.run([NODE, str(SCRIPT)], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@needs_node
def test_fixed_cases_agree_with_a_second_implementation_in_javascript():
    assert [course_hashes(case) for case in FIXED] == node_hashes(FIXED)


@needs_node
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(CASES, min_size=200, max_size=200))
def test_drawn_cases_agree_with_a_second_implementation_in_javascript(cases):
    assert [course_hashes(case) for case in cases] == node_hashes(cases)


def test_fresh_interpreters_with_different_hash_seeds_agree():
    """Python's ``hash()`` changes with PYTHONHASHSEED; the block hash must not."""
    code = ("import json, sys; from course.v1.block_hash import none_hash, request_block_hashes;"
            "c = json.loads(sys.argv[1]); print(json.dumps([h.hex() for h in request_block_hashes("
            "c['tokens'], c['block_size'], none_hash(c['seed']), lora_name=c['lora_name'], "
            "cache_salt=c['cache_salt'])]))")
    seen = set()
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outputs = [subprocess.run([sys.executable, "-c", code, json.dumps(case)], env=env,
                                  capture_output=True, text=True, timeout=120,
                                  check=True).stdout for case in FIXED[:2]]
        seen.add(tuple(outputs))
    assert seen == {tuple(json.dumps(course_hashes(case)) + "\n" for case in FIXED[:2])}


def test_the_seed_is_the_hash_of_its_string():
    assert none_hash("0") == hashlib.sha256(b"\x61\x30").digest()  # CBOR text "0": 0x61 0x30


def test_a_salt_or_an_adapter_changes_every_block_and_a_shared_prefix_shares_its_blocks():
    tokens = list(range(40))
    plain = request_block_hashes(tokens, 8, none_hash())
    salted = request_block_hashes(tokens, 8, none_hash(), cache_salt="tenant-a")
    adapted = request_block_hashes(tokens, 8, none_hash(), lora_name="adapter")
    assert not set(plain) & set(salted) and not set(plain) & set(adapted)
    longer = request_block_hashes(tokens + [99] * 9, 8, none_hash())
    assert longer[:5] == plain and len(longer) == 6


# --- what the comparison catches ---------------------------------------------------------------


def _chained(encode, salt_everywhere=False, parent_last=False, empty_keys=()):
    def hashes(tokens, block_size, first, lora_name=None, cache_salt=None):
        out, parent = [], first
        for start in range(0, len(tokens) - block_size + 1, block_size):
            keys = [lora_name] if lora_name else []
            if cache_salt and (salt_everywhere or not start):
                keys.append(cache_salt)
            block = tuple(tokens[start:start + block_size])
            extra = tuple(keys) if keys else (empty_keys if empty_keys != () else None)
            triple = (block, extra, parent) if parent_last else (parent, block, extra)
            parent = hashlib.sha256(encode(triple)).digest()
            out.append(parent)
        return out
    return hashes


def _cbor(value):
    return cbor2.dumps(value, canonical=True)


WRONG = {
    "pickle-instead-of-cbor": (_chained(lambda v: pickle.dumps(v, protocol=5)), none_hash),
    "json-instead-of-cbor": (_chained(lambda v: json.dumps(v, default=bytes.hex).encode()),
                             none_hash),
    "parent-last": (_chained(_cbor, parent_last=True), none_hash),
    "salt-on-every-block": (_chained(_cbor, salt_everywhere=True), none_hash),
    "empty-tuple-for-no-keys": (_chained(_cbor, empty_keys=[]), none_hash),
    "another-seed": (request_block_hashes, lambda seed: none_hash(seed + "1")),
    "seed-hashed-as-bytes": (request_block_hashes,
                             lambda seed: hashlib.sha256(seed.encode()).digest()),
    "random-seed-per-process": (request_block_hashes, lambda seed: os.urandom(32)),
}


@needs_node
@pytest.mark.parametrize("name", list(WRONG))
def test_a_wrong_hash_disagrees_with_the_second_implementation(name):
    hasher, first = WRONG[name]
    cases = [case for case in FIXED if len(case["tokens"]) >= case["block_size"]]
    assert [course_hashes(c, hasher, first) for c in cases] != node_hashes(cases)


def test_the_course_hash_is_vllms_sha256_cbor_of_the_triple():
    parent = none_hash()
    assert sha256_cbor((parent, (1, 2), None)) == hashlib.sha256(
        b"\x83" + b"\x58\x20" + parent + b"\x82\x01\x02" + b"\xf6").digest()
