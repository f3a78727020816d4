"""Chapter 14: one block hash for a whole fleet.

A router can only send a request to the engine that holds its prefix if every engine names a
block the same way, byte for byte, and the router names it that way too. Chapter 4's keys
were right for one process; a fleet needs them fixed down to the encoding. vLLM's
``prefix_caching_hash_algo="sha256_cbor"`` (``vllm/utils/hashing.py``,
``vllm/v1/core/kv_cache_utils.py``, vLLM 0.11 on) is such a hash::

    block 0:  sha256( CBOR( (NONE_HASH, (t0, ..., t15), extra_keys_0) ) )   -> h0
    block 1:  sha256( CBOR( (h0,        (t16, ..., t31), extra_keys_1) ) )  -> h1
    ...

* **CBOR, canonical** (RFC 8949): a tuple is an array, a hash a byte string, a token an
  integer, a name a text string, nothing is ``null``; one value has one encoding, in every
  language, where Python's ``pickle`` or ``hash()`` do not.
* **NONE_HASH**, the first block's parent, is the hash of a seed (vLLM's ``init_none_hash``
  reads it from ``PYTHONHASHSEED``, and draws 32 random bytes when it is unset). Engines with
  different seeds share no block: a fleet whose seeds differ has a hit rate of zero, with no
  error anywhere.
* **Extra keys** tell apart blocks whose tokens are equal but whose K/V are not
  (``generate_block_hash_extra_keys``): a LoRA adapter's name, on every block; a tenant's
  ``cache_salt``, on the first block only, since every later hash chains from it; in that
  order, and ``None`` (not an empty tuple) when there are none.

Only full blocks have a hash. Answers are the bodies between ``### BEGIN SOLUTION`` and
``### END SOLUTION``: chapter 14's notebook renders its cells from them, and a learner edition
replaces them with stubs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import cbor2

FLEET_SEED = "0"  # the PYTHONHASHSEED every engine and the router of the course's fleet share


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 of ``value``'s canonical CBOR encoding (vLLM's ``sha256_cbor``): 32 bytes."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def none_hash(seed: str = FLEET_SEED) -> bytes:
    """The parent of every prefix's first block: ``sha256_cbor`` of the seed string, as vLLM's
    ``init_none_hash`` computes it from ``PYTHONHASHSEED``."""
    return sha256_cbor(seed)


def hash_block_tokens(parent_block_hash: bytes, token_ids: Sequence[int],
                      extra_keys: tuple[Any, ...] | None = None) -> bytes:
    """The hash of one full block: ``sha256_cbor`` of the triple (``parent_block_hash``, the
    block's ``token_ids`` as a tuple of Python ints, ``extra_keys``), in that order."""
    ### BEGIN SOLUTION
    return sha256_cbor((parent_block_hash, tuple(int(t) for t in token_ids), extra_keys))
    ### END SOLUTION


def request_block_hashes(token_ids: Sequence[int], block_size: int, first_parent: bytes,
                         lora_name: str | None = None,
                         cache_salt: str | None = None) -> list[bytes]:
    """The chained hashes of the full blocks of ``token_ids`` (a partial last block has none):
    block 0's parent is ``first_parent`` (``none_hash(seed)``), each later block's parent the
    block before it. A block's extra keys are ``lora_name`` (every block, when given), then
    ``cache_salt`` (block 0 only, when given), as a tuple; ``None`` when a block has none."""
    ### BEGIN SOLUTION
    hashes, parent = [], first_parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys = ([lora_name] if lora_name else []) + ([cache_salt] if cache_salt and not start
                                                     else [])
        parent = hash_block_tokens(parent, token_ids[start:start + block_size],
                                   tuple(keys) or None)
        hashes.append(parent)
    return hashes
    ### END SOLUTION
