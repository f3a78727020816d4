"""What each program of a Triton kernel read and wrote, on Triton's CPU interpreter.

The interpreter runs a launch's programs one after another, in grid order, so a program that
writes into another program's output goes unseen when that program runs later and overwrites
it (on a GPU the two race), and a masked load from an address past a table's end reads
nothing. Inside ``with MemoryAudit() as audit:`` every load and store the interpreter performs
is written down with the program that performed it (its grid index), its addresses (the lanes
its mask lets through) and the lane coordinates in the tile, and every launch's grid: checks
then ask which elements of a tensor each program touched.

The audit also fences each launch in: a lane whose address lies in none of the launch's
tensor arguments' storages is written down but not performed (a load gets ``other``, a store
is dropped), so a kernel that stores past its output's end, or reads a block far past the
pool, fails a check with a hint instead of corrupting memory or killing the process. A store
writes one tensor: its lanes are performed only inside the argument that holds most of them.
A store past the output's end lands, as often as not, in the storage the launcher allocated
next (the requests' lengths or offsets): performed, it would send later programs' loops over
millions of blocks.

Off the interpreter (a GPU) nothing is recorded and ``active`` is False: the checks that
need it say so and skip it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Access:
    """One load or store: which program, the addresses it touched, their lanes' coordinates
    in the tile (a tuple of arrays, one per tile dimension), and the tile's shape."""

    kind: str  # "load" or "store"
    program: tuple[int, int, int]
    addresses: np.ndarray  # uint64 byte addresses, the lanes the mask let through
    lanes: tuple[np.ndarray, ...]
    shape: tuple[int, ...]


class MemoryAudit:
    """Records loads, stores and grids while active (see the module's doc)."""

    def __init__(self) -> None:
        self.accesses: list[Access] = []
        self.grids: list[tuple[int, int, int]] = []
        self.active = False
        self._builder = None
        self._executor = None
        self._fence: list[tuple[int, int]] = []

    def __enter__(self) -> MemoryAudit:
        if os.environ.get("TRITON_INTERPRET") != "1":
            return self
        try:
            from triton.runtime import interpreter

            builder = interpreter.interpreter_builder
            load, store = builder.create_masked_load, builder.create_masked_store
            set_grid_dim = builder.set_grid_dim
            executor = interpreter.GridExecutor
            init_args = executor._init_args_hst
        except (ImportError, AttributeError):  # another Triton: nothing to record with
            return self

        def fenced_init_args(grid_executor, args_dev, kwargs):
            args_hst, kwargs_hst = init_args(grid_executor, args_dev, kwargs)
            self._fence = [_storage(a) for a in (*args_hst, *kwargs_hst.values())
                           if isinstance(a, torch.Tensor)]
            return args_hst, kwargs_hst

        def record(kind: str, ptrs, mask):
            """Write the access down; return the mask less the lanes outside the fence: for a
            load, every argument; for a store, the argument that holds most of its lanes."""
            data = np.asarray(ptrs.data)
            keep = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
            self.accesses.append(Access(kind, tuple(builder.grid_idx), data[keep].astype(
                np.uint64), tuple(np.nonzero(keep)), data.shape))
            if not self._fence:
                return mask
            regions = [(data >= start) & (data < end) for start, end in self._fence]
            if kind == "store":
                inside = max(regions, key=lambda lanes: np.count_nonzero(lanes & keep))
            else:
                inside = np.logical_or.reduce(regions)
            if (inside | ~keep).all():
                return mask
            return dataclasses.replace(mask, data=np.ascontiguousarray(keep & inside))

        def masked_load(ptrs, mask, *args, **kwargs):
            return load(ptrs, record("load", ptrs, mask), *args, **kwargs)

        def masked_store(ptrs, value, mask, *args, **kwargs):
            return store(ptrs, value, record("store", ptrs, mask), *args, **kwargs)

        def grid_dim(nx, ny, nz):
            self.grids.append((nx, ny, nz))
            return set_grid_dim(nx, ny, nz)

        builder.create_masked_load = masked_load
        builder.create_masked_store = masked_store
        builder.set_grid_dim = grid_dim
        executor._init_args_hst = fenced_init_args
        self._executor = (executor, init_args)
        self._builder = builder
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self._builder is not None:
            for name in ("create_masked_load", "create_masked_store", "set_grid_dim"):
                self._builder.__dict__.pop(name, None)
            self._builder = None
        if self._executor is not None:
            executor, init_args = self._executor
            executor._init_args_hst = init_args
            self._executor = None
        self._fence = []

    # --- questions --------------------------------------------------------------------------

    def touching(self, tensor: torch.Tensor, kind: str):
        """(access, element offsets from ``tensor``'s first element, lane mask) for every
        ``kind`` access that touched ``tensor``'s storage."""
        start, end = _storage(tensor)
        size = tensor.element_size()
        for access in self.accesses:
            if access.kind != kind or not len(access.addresses):
                continue
            inside = (access.addresses >= start) & (access.addresses < end)
            if inside.any():
                offsets = (access.addresses.astype(np.int64) - tensor.data_ptr()) // size
                yield access, offsets, inside

    def stray_loads(self, tensors: list[torch.Tensor], kind: str = "load"
                    ) -> list[tuple[Access, int]]:
        """Loads (or ``kind`` accesses) at an address in none of ``tensors``' storages:
        (access, address)."""
        regions = [_storage(t) for t in tensors]
        found = []
        for access in self.accesses:
            if access.kind != kind or not len(access.addresses):
                continue
            outside = np.ones(len(access.addresses), dtype=bool)
            for start, end in regions:
                outside &= ~((access.addresses >= start) & (access.addresses < end))
            if outside.any():
                found.append((access, int(access.addresses[outside][0])))
        return found


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def nearest(tensors: dict[str, torch.Tensor], address: int) -> str:
    """Where ``address`` lies relative to the nearest of ``tensors`` (for a hint)."""
    best = None
    for name, tensor in tensors.items():
        start, end = _storage(tensor)
        size = tensor.element_size()
        if address >= end:
            distance, text = address - end, f"{(address - end) // size + 1} elements past the " \
                f"end of {name}"
        else:
            distance, text = start - address, f"{(start - address) // size} elements before " \
                f"{name}"
        if best is None or distance < best[0]:
            best = (distance, text)
    return best[1] if best else "outside every argument"
