"""Scripted BlockManager scenarios, recorded frame by frame for the chapter 3 animation.

A script is a list of operations: ``("allocate", seq, num_tokens)``, ``("append", seq)``,
``("fork", parent, child)`` and ``("free", seq)``. ``record`` plays one against a manager and
keeps, after every operation, what the manager's public methods report, so the animation
shows the learner's own code, bugs included.
"""

from __future__ import annotations

import random

from course.language import tr_later
from course.v0.block_manager import NoFreeBlocksError
from course.v0.frames import Frame

Operation = tuple


def record(manager: object, num_blocks: int, script: list[Operation]) -> list[Frame]:
    """Play ``script`` on ``manager`` and return one frame per operation (plus the start).

    NotImplementedError propagates (the caller falls back to the course's own version); any
    other exception is recorded as a failed step, and the script goes on.
    """
    live: dict[int, None] = {}

    def frame(event: str, copy: tuple | None = None, failed: bool = False) -> Frame:
        return Frame(event, {s: list(manager.block_table(s)) for s in live},
                     {s: manager.seq_len(s) for s in live},
                     [manager.ref_count(b) for b in range(num_blocks)],
                     manager.num_free_blocks(), copy, failed)

    frames = [frame(tr_later(f"an empty pool of {num_blocks} blocks"))]
    for op in script:
        kind, args = op[0], op[1:]
        text = f"{'append_slot' if kind == 'append' else kind}({', '.join(map(str, args))})"
        copy = None
        try:
            if kind == "allocate":
                result = manager.allocate(*args)
                live[args[0]] = None
                text += tr_later(f" -> blocks {list(result)}")
            elif kind == "append":
                slot = manager.append_slot(*args)
                text += tr_later(f" -> block {slot.block}, offset {slot.offset}")
                if slot.copy is not None:
                    copy = (slot.copy.src, slot.copy.dst, slot.copy.num_slots)
                    text += tr_later(f"; copy-on-write: {copy[2]} slot(s) of block {copy[0]} "
                                     f"into block {copy[1]}")
            elif kind == "fork":
                manager.fork(*args)
                live[args[1]] = None
                text += tr_later(f": sequence {args[1]} shares sequence {args[0]}'s blocks")
            elif kind == "free":
                manager.free(*args)
                live.pop(args[0], None)
        except NotImplementedError:
            raise
        except NoFreeBlocksError as exc:
            frames.append(frame(tr_later(f"{text} raised NoFreeBlocksError: {exc}"), failed=True))
            continue
        except Exception as exc:  # the learner's bug: show it, keep going
            frames.append(frame(tr_later(f"{text} raised {type(exc).__name__}: {exc}"),
                                failed=True))
            continue
        frames.append(frame(text, copy))
    return frames


def interleaved_growth() -> list[Operation]:
    """Two requests growing in turns: their blocks interleave in the pool, their tokens never
    mix."""
    script: list[Operation] = [("allocate", 0, 5), ("allocate", 1, 3)]
    for _ in range(7):
        script += [("append", 0), ("append", 1)]
    return script + [("free", 0), ("free", 1)]


def beam_search(width: int = 3, prompt: int = 6, steps: int = 10, seed: int = 0
                ) -> list[Operation]:
    """Beam search: one prompt forked into ``width`` beams; each step every beam grows by a
    token, then the beams that lost are freed and the winners forked (random winners here)."""
    rng = random.Random(seed)
    script: list[Operation] = [("allocate", 0, prompt)]
    beams, next_id = [0], 1
    for _ in range(1, width):
        script.append(("fork", 0, next_id))
        beams.append(next_id)
        next_id += 1
    for _ in range(steps):
        script += [("append", b) for b in beams]
        parents = sorted(rng.choices(beams, k=width))
        survivors = []
        for beam in beams:
            children = parents.count(beam)
            if children == 0:
                script.append(("free", beam))
                continue
            survivors.append(beam)
            for _ in range(children - 1):
                script.append(("fork", beam, next_id))
                survivors.append(next_id)
                next_id += 1
        beams = survivors
    return script + [("free", b) for b in beams]


def running_out() -> list[Operation]:
    """Five blocks of 4 fill up: a prompt that does not fit, a token that finds no block (both
    change nothing), then a request that fits once another leaves."""
    return [("allocate", 0, 8), ("allocate", 1, 7), ("allocate", 2, 9), ("append", 1),
            ("append", 1), ("append", 0), ("free", 0), ("allocate", 2, 6)]


def probe(manager_class: type) -> list[tuple]:
    """What a BlockManager reports along a short script that allocates, grows, forks, copies
    on write, runs out, allocates an id in use, forks an unknown parent and frees, in terms
    every correct manager reports alike: after each step, whether it raised (and whether that
    was NoFreeBlocksError), each sequence's length and number of blocks, the reference counts
    in sorted order, the free blocks and the size of any copy (never which blocks it chose);
    whether the table allocate returns is the caller's own list, and what a token that finds
    no free block raises. A notebook compares the
    learner's class with the course's on it before running a picture or an experiment on the
    learner's."""
    script: list[Operation] = [("allocate", 0, 3), ("fork", 0, 1), ("append", 1),
                               ("append", 0), ("append", 0), ("allocate", 2, 5), ("free", 0),
                               ("allocate", 2, 5), ("append", 2), ("fork", 2, 3),
                               ("append", 3), ("allocate", 3, 40), ("fork", 9, 8),
                               ("free", 1), ("free", 2), ("free", 3)]
    frames = record(manager_class(6, 2), 6, script)
    seen: list[tuple] = [
        (f.failed, f.failed and f.event.split(" raised ")[-1].startswith("NoFreeBlocksError"),
         f.lengths, {s: len(t) for s, t in f.tables.items()}, sorted(f.ref_counts),
         f.free_blocks, f.copy and f.copy[2]) for f in frames]
    spare = manager_class(4, 2)
    table = spare.allocate(0, 3)
    table.append(-1)
    seen.append(("allocate returns a list of the caller's own",
                 spare.block_table(0) == table[:-1]))
    full = manager_class(1, 1)
    full.allocate(0, 1)
    try:
        full.append_slot(0)
        ran_out = "nothing"
    except NoFreeBlocksError:
        ran_out = "NoFreeBlocksError"
    except Exception:  # the learner's bug: the wrong error
        ran_out = "another error"
    return seen + [("a token with no free block raises", ran_out)]
