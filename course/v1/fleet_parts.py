"""Chapter 14's answers as a fleet runs them, in one place.

A fleet's engines hash blocks (``request_block_hashes``), its router's index applies their
events and finds overlaps (``indexer``, a ``KVIndexer`` class) and it picks an engine
(``choose_engine``). The simulator (``course.experiments.fleet_sim``) and the fleet of
processes (``course.v1.fleet``) take them as ``FleetParts``: the course's by default, a
notebook's own answers where it gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course.v1 import block_hash, kv_indexer, kv_router


@dataclass(frozen=True)
class FleetParts:
    request_block_hashes: Callable[..., list[bytes]] = block_hash.request_block_hashes
    indexer: type = kv_indexer.KVIndexer
    choose_engine: Callable[..., int] = kv_router.choose_engine
