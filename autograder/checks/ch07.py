"""Visible checks for chapter 7, a Triton paged-attention kernel: each TODO's readable case.

Cases are chapter 6's: a NaN-filled pool with shuffled physical blocks. Here the block
tables are also a view into a wider buffer (a row stride larger than the row), whose slack
points at a decoy block of finite values, so a kernel that reads the table with the wrong
stride gets wrong numbers rather than a crash. Expected outputs and partials, and what known
mistakes would produce, come from the chapter's hidden module (``autograder.private``),
asked by a case's description (its shapes and seed); the thorough checks are there too.

On Triton's CPU interpreter the shapes stay small. On a GPU the thorough wrapper check also
runs production shapes (contexts to 32k, batches to 256, head dims 64 to 256, bf16) and a
pool with more than 2^31 elements, where an int32 offset would wrap.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call, not_written
from autograder.checks.ch06 import PagedCase
from autograder.private import private, visible
from kernels.paged_attention import launch
from kernels.split_kv import run_merge_kernel, run_split_kernel

SEED = 2027
_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}  # (atol, rtol)
_TF32 = (2e-3, 2e-3)  # fp32 tl.dot on a GPU multiplies in TF32 (10-bit mantissa)


def on_gpu() -> bool:
    """Whether kernels compile for a CUDA GPU (rather than run on the interpreter)."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _device() -> str:
    return "cuda" if on_gpu() else "cpu"


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TF32 if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]


class KernelCase(PagedCase):
    """A chapter-6 case whose block tables are a strided view into a wider buffer, on the
    device the kernels run on."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=SEED):
        super().__init__(lengths, block_size, q_heads, kv_heads, head_dim, dtype, seed)
        dtype = self.dtype
        used = set(self.tables.flatten().tolist())
        decoy = max(set(range(self.k_cache.shape[0])) - used)
        gen = torch.Generator().manual_seed(seed + 1)
        self.k_cache[decoy] = torch.randn(self.k_cache[decoy].shape, generator=gen).to(dtype)
        self.v_cache[decoy] = torch.randn(self.v_cache[decoy].shape, generator=gen).to(dtype)
        rows, width = self.tables.shape
        wide = torch.full((max(rows, width) + 1, width + 3), decoy, dtype=torch.int32)
        wide[:rows, :width] = self.tables
        self.tables = wide[:rows, :width]  # row stride width + 3
        device = _device()
        for name in ("k_cache", "v_cache", "tables", "seq_lens", "query"):
            setattr(self, name, getattr(self, name).to(device))

    def arguments(self) -> tuple:
        """query, k_cache, v_cache, block_tables, seq_lens, scale: a decode call's arguments."""
        return self.query, self.k_cache, self.v_cache, self.tables, self.seq_lens, self.scale

    def describe(self) -> str:
        return super().describe() + f", block table row stride {self.tables.stride(0)}"


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    atol, rtol = _tolerance(dtype)
    return torch.allclose(got.double().cpu(), want.double().cpu(), atol=atol, rtol=rtol)


def _diagnose(out: torch.Tensor, case: KernelCase, bad: list[int],
              known: Callable[[], dict]) -> str:
    """What a wrong output matches, as a hint; ``known()`` gives what the known mistakes
    compute (``no_scale``, ``kv_head_modulo``)."""
    if out.isnan().any():
        return ("It has NaN: garbage from slots past a sequence's end leaked in. Mask the "
                "tail: load with mask=position < seq_len and other=0, and set masked scores "
                "to -inf before the softmax. ")
    got = out.cpu()
    mistakes = known()

    def matches(mistake: str) -> bool:
        wrong = mistakes[mistake]
        return wrong is not None and all(_close(got[s], wrong[s], case.dtype) for s in bad)

    if matches("no_scale"):
        return "It matches attention without the scale: multiply the scores by scale. "
    group = case.q_heads // case.kv_heads
    if group > 1 and matches("kv_head_modulo"):
        return ("It matches KV head h % num_kv_heads: the query heads of a group are "
                "consecutive, so query head h uses KV head h // GROUP, and the program for KV "
                "head g loads query heads g x GROUP to g x GROUP + GROUP - 1. ")
    one_block = [s for s in range(len(case.lengths)) if case.lengths[s] <= case.block_size]
    if one_block and not set(one_block) & set(bad):
        return ("Sequences of one block are right and longer ones are not: when a block "
                "raises the running max, rescale the running sum and accumulator by "
                "exp(m_old - m_new) before adding the block. ")
    if 0 not in bad:
        return ("Sequence 0 is right and later ones are not: row seq of the block table "
                "starts at block_tables_ptr + seq x stride_table_seq (the row stride, which "
                "can exceed the row's length). ")
    return ""


_IDEA = ("Query head h attends with scale x (q . k) over the first seq_len tokens of its "
         "sequence through KV head h // GROUP; token t is at block_tables[seq, t // "
         "BLOCK_SIZE], offset t % BLOCK_SIZE.")


def _compare(out, case: KernelCase, name: str, want: torch.Tensor,
             known: Callable[[], dict]) -> None:
    """``out`` against ``want`` (chapter 6's attention on the case, in its dtype)."""
    if not isinstance(out, torch.Tensor) or out.shape != case.query.shape:
        raise AssertionError(f"{name}(...) on {case.describe()} returned "
                             f"{getattr(out, 'shape', type(out).__name__)}, expected shape "
                             f"{tuple(case.query.shape)}.")
    if out.dtype != case.query.dtype:
        raise AssertionError(f"{name}(...) on {case.describe()} returned {out.dtype}; the "
                             f"output has the query's dtype, {case.query.dtype}.")
    bad = [s for s in range(len(case.lengths)) if not _close(out[s], want[s], case.dtype)]
    if not bad:
        return
    error = (out[bad[0]].double().cpu() - want[bad[0]].double()).abs().max().item()
    raise AssertionError(f"{name}(...) on {case.describe()}: sequence {bad[0]} (length "
                         f"{case.lengths[bad[0]]}) is off by up to {error:.3g}. "
                         + _diagnose(out, case, bad, known) + _IDEA)


def asked(case: KernelCase) -> tuple[torch.Tensor, Callable[[], dict]]:
    """The expected output of ``case`` and what known mistakes give there, asked before the
    code under test runs."""
    answers = private("07")
    want = answers.kernel_expected(**case.spec())
    known = answers.kernel_mistakes(**case.spec())
    return want, lambda: known


def _kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool,
            want: torch.Tensor, known: Callable[[], dict]) -> None:
    out = learner_call(name, launch, fn, *case.arguments(), per_query_head=per_query_head)
    _compare(out, case, name, want, known)


def _visible_kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool) -> None:
    _kernel(fn, name, case, per_query_head, *asked(case))


# --- step 1: one block -----------------------------------------------------------------------


@visible
def check_one_block_kernel(fn: Callable) -> None:
    """Two sequences of exactly one block of 4, 4 query heads over 2 KV heads."""
    _visible_kernel(fn, "one_block_kernel", KernelCase([4, 4], 4, 4, 2), per_query_head=True)


# --- step 2: the loop over the block table ---------------------------------------------------


@visible
def check_block_loop_kernel(fn: Callable) -> None:
    """Sequences of 3 blocks and 1 block of 4 (lengths 12 and 4), 4 query heads over 2."""
    _visible_kernel(fn, "block_loop_kernel", KernelCase([12, 4], 4, 4, 2), per_query_head=True)


# --- step 3: GQA packing ---------------------------------------------------------------------


@visible
def check_gqa_kernel(fn: Callable) -> None:
    """Lengths 12 and 4 in blocks of 4, 8 query heads over 2 KV heads (groups of 4)."""
    _visible_kernel(fn, "gqa_kernel", KernelCase([12, 4], 4, 8, 2), per_query_head=False)


# --- step 4: the masked tail -----------------------------------------------------------------


@visible
def check_paged_attention_kernel(fn: Callable) -> None:
    """Lengths 9, 4 and 5 in blocks of 4: tails of one token, and one full block."""
    _visible_kernel(fn, "paged_attention_kernel", KernelCase([9, 4, 5], 4, 4, 2),
                    per_query_head=False)


# --- split-KV --------------------------------------------------------------------------------

_SPLIT_IDEA = ("A split's partial covers blocks [split x blocks_per_split, (split + 1) x "
               "blocks_per_split) of the sequence, clipped to its length: m is the largest "
               "scaled score, l the sum of exp(score - m), acc the sum of exp(score - m) x "
               "value.")


def _split(fn: Callable, case: KernelCase, num_splits: int, want: dict):
    """The learner's partials against ``want`` (float64 ``m``, ``l``, ``acc`` per (seq,
    query head, split), and ``empty``: the splits that cover no token); returns them."""
    name = "split_kv_kernel"
    partials = learner_call(name, run_split_kernel, fn, *case.arguments(), num_splits)
    got_m, got_l, got_acc = (t.double().cpu() for t in partials)
    atol, rtol = _tolerance(case.dtype)
    where = f"{name}(...) on {case.describe()}, {num_splits} splits"
    for seq in range(len(case.lengths)):
        for split in range(num_splits):
            for head in range(case.q_heads):
                at = f"{where}: sequence {seq}, query head {head}, split {split}"
                index = seq, head, split
                if want["empty"][index]:
                    m = got_m[index].item()
                    if got_l[index] != 0 or got_acc[index].abs().max() != 0 or m != m \
                            or m == float("inf"):
                        raise AssertionError(
                            f"{at} covers no tokens of the sequence (length "
                            f"{case.lengths[seq]}), so it must write l = 0 and acc = 0 (and "
                            f"m = -inf); got l = {got_l[index].item():.4g}, m = {m:.4g}. Clip "
                            "the split's block range to cdiv(seq_len, BLOCK_SIZE) and still "
                            "store the empty partial.")
                    continue
                checks = [("m", got_m[index], want["m"][index]),
                          ("l", got_l[index], want["l"][index]),
                          ("acc", got_acc[index], want["acc"][index])]
                for label, got, expected in checks:
                    if not torch.allclose(got, expected, atol=atol, rtol=rtol):
                        hint = ""
                        if label == "acc" and torch.allclose(got * want["l"][index], expected,
                                                             atol=atol, rtol=rtol):
                            hint = "It is acc / l: store acc undivided; the merge divides. "
                        raise AssertionError(
                            f"{at}: {label} is wrong (off by up to "
                            f"{(got - expected).abs().max().item():.3g}). {hint}" + _SPLIT_IDEA)
    return partials


@visible
def check_split_kv_kernel(fn: Callable) -> None:
    """Lengths 5 and 17 in blocks of 4 (tables of 6 blocks), 3 splits of 2 blocks: the
    first sequence's last two splits are empty."""
    case = KernelCase([5, 17], 4, 4, 2)
    _split(fn, case, 3, private("07").split_partials(**case.spec(), num_splits=3))


def merge_inputs(seqs: int, heads: int, splits: int, head_dim: int, spread: float):
    """Seeded float64 partials (m, l, acc) of ``splits`` splits, about 30 % of them empty
    (m = -inf, l = 0, acc = 0; a sequence's first split never is)."""
    gen = torch.Generator().manual_seed(SEED + splits)
    m = torch.randn(seqs, heads, splits, generator=gen, dtype=torch.float64) * spread
    total = torch.rand(seqs, heads, splits, generator=gen, dtype=torch.float64) * 10 + 1
    acc = torch.randn(seqs, heads, splits, head_dim, generator=gen, dtype=torch.float64) * 5
    empty = torch.rand(seqs, heads, splits, generator=gen) < 0.3
    empty[..., 0] = False  # a sequence's first split always has tokens
    m[empty], total[empty], acc[empty] = float("-inf"), 0.0, 0.0
    return m, total, acc


def _merge(fn: Callable, ask: Callable, seqs: int, heads: int, splits: int, head_dim: int,
           spread: float, dtype: torch.dtype = torch.float32) -> None:
    """The learner's merge of ``merge_inputs`` against ``ask``'s: the merged softmax, and
    what adding the partials without rescaling gives."""
    want, plain = ask(seqs=seqs, heads=heads, splits=splits, head_dim=head_dim, spread=spread)
    device = _device()
    partials = [t.float().to(device) for t in merge_inputs(seqs, heads, splits, head_dim,
                                                           spread)]
    out = learner_call("merge_splits_kernel", run_merge_kernel, fn, *partials, dtype)
    atol, rtol = _tolerance(dtype)
    if isinstance(out, torch.Tensor) and not out.isnan().any() and torch.allclose(
            out.double().cpu(), want, atol=atol, rtol=max(rtol, 1e-5)):
        return
    hint = ""
    if isinstance(out, torch.Tensor) and torch.allclose(out.double().cpu(), plain, rtol=1e-4):
        hint = "It adds the partials without rescaling them to a common max. "
    raise AssertionError(
        f"merge_splits_kernel(...) on {seqs} sequences x {heads} heads x {splits} splits "
        f"(head dim {head_dim}, max scores spread {spread}, some splits empty) disagrees with "
        f"the merged softmax. {hint}With M = max over splits of m, out = sum e^(m - M) acc / "
        "sum e^(m - M) l; an empty split (m = -inf, l = 0) adds nothing.")


@visible
def check_merge_splits_kernel(fn: Callable) -> None:
    """Two sequences, 4 heads, 3 splits, head dim 16."""
    _merge(fn, private("07").merge_case, 2, 4, 3, 16, 1.0)


# --- the host wrapper ------------------------------------------------------------------------

_CHECKS = ("A wrapper checks what the kernel silently assumes: query [num_seqs, num_q_heads, "
           "head_dim], caches of one shape [num_blocks, block_size, num_kv_heads, head_dim], "
           "num_q_heads a multiple of num_kv_heads, tables [num_seqs, max_blocks], seq_lens "
           "[num_seqs], power-of-two head_dim and block_size, one float dtype for query and "
           "caches, integer tables and lengths, one device, caches with equal strides.")


def _bad_inputs(name: str, case: KernelCase):
    """A broken version of ``case``'s arguments, and the error it must raise."""
    q, k, v, t, s = case.query, case.k_cache, case.v_cache, case.tables, case.seq_lens
    return {
        "a query without its batch dimension": ((q[0], k, v, t, s), ValueError),
        "caches of different shapes": ((q, k, v[:-1], t, s), ValueError),
        "6 query heads over 4 KV heads": ((q[:, :3].repeat(1, 2, 1), k.repeat(1, 1, 2, 1),
                                           v.repeat(1, 1, 2, 1), t, s), ValueError),
        "a block table with one row too few": ((q, k, v, t[:-1], s), ValueError),
        "seq_lens with one entry too many": ((q, k, v, t, torch.cat([s, s[:1]])), ValueError),
        "head_dim 12 (not a power of two)": ((q[..., :12], k[..., :12].contiguous(),
                                             v[..., :12].contiguous(), t, s), ValueError),
        "a float16 query over float32 caches": ((q.half(), k, v, t, s), TypeError),
        "a float block table": ((q, k, v, t.float(), s), TypeError),
        "seq_lens on another device (meta)": ((q, k, v, t, s.to("meta")), ValueError),
        "a v_cache with other strides": ((q, k, v.transpose(0, 1).contiguous().transpose(0, 1),
                                          t, s), ValueError),
    }[name]


def _raises(fn: Callable, case: KernelCase, what: str) -> None:
    args, error = _bad_inputs(what, case)
    try:
        fn(*args, case.scale)
    except error:
        return
    except NotImplementedError:
        raise AssertionError(not_written("paged_attention")) from None
    except Exception as exc:
        raise AssertionError(f"paged_attention(...) with {what} raised {type(exc).__name__}: "
                             f"{str(exc)[:200]}; expected {error.__name__}. {_CHECKS}") from exc
    raise AssertionError(f"paged_attention(...) with {what} returned without an error; "
                         f"expected {error.__name__}. {_CHECKS}")


def _wrapper(fn: Callable, case: KernelCase, want: torch.Tensor,
             known: Callable[[], dict]) -> None:
    out = learner_call("paged_attention", fn, *case.arguments())
    name = "paged_attention"
    if case.dtype == torch.bfloat16 and not on_gpu() and isinstance(out, torch.Tensor) \
            and not _close(out, want, case.dtype):
        raise AssertionError(f"{name}(...) on {case.describe()} is wrong: the interpreter "
                             "has no bf16 arithmetic, so upcast bf16 inputs to float32 there "
                             "and cast the output back.")
    _compare(out, case, name, want, known)


@visible
def check_paged_attention(fn: Callable) -> None:
    """Lengths 5, 9 and 4 in blocks of 4; and a float16 query over float32 caches must raise
    TypeError."""
    case = KernelCase([5, 9, 4], 4, 4, 2)
    _wrapper(fn, case, *asked(case))
    _raises(fn, case, "a float16 query over float32 caches")

