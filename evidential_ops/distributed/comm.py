"""The collectives of the global-batch loss (docs/distributed.md).

Everything here is torch.distributed (NCCL on GPUs, gloo on CPU); nothing is home-made. Three
pieces:

- `Layout` and `agree`: before any data moves, every rank all-gathers one small float64 vector
  (its row count K_r, its embedding size, dtype, options, and whether its input passed the
  checks). From it each rank learns the sizes of the uneven strips, and every rank sees a bad
  input on any rank at the same point, so that all of them raise instead of some waiting in a
  collective the others never reach.
- `gather_rows` / `scatter_rows`: all-gather of (K_r, ...) rows into the (K_global, ...) batch and
  the reduce-scatter (SUM) that hands each owner its rows of a (K_global, ...) tensor. gloo's
  all-gather needs equal sizes, so uneven strips are zero-padded to K_max = max_r K_r (one code
  path for gloo and NCCL; the padding is part of the volume that `communication_volume` counts).
  A strip may be empty (K_r = 0). Each comes in a collective half and a local half
  (`all_gather_padded` + `unpad_rows`, `scatter_buffers` + `reduce_scatter_buffers`), so that a
  caller can catch the local half's errors (out of memory) and report them through a flag.
- `fail_together`: after an all-reduced error flag says some rank failed, every rank raises: the
  failing ranks their own error, the others a `PeerError` quoting it.
- `CommunicationCounter`: a dispatch mode that records the bytes of every c10d collective issued
  while it is active (what the volume test and bench/distributed_bench.py measure).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "CommunicationCounter",
    "Layout",
    "PeerError",
    "PeerInputError",
    "agree",
    "all_gather_padded",
    "all_reduce_sum",
    "communication_volume",
    "fail_together",
    "gather_rows",
    "group_info",
    "reduce_scatter_buffers",
    "scatter_buffers",
    "scatter_rows",
    "unpad_rows",
]


class PeerError(RuntimeError):
    """Raised on the ranks that did not fail when another rank of the group failed.

    The failing rank raises its own error (e.g. torch.OutOfMemoryError in the backward); every
    other rank raises this one, naming the failing rank(s) and quoting their errors, at the same
    point, so that no rank is left waiting in a collective.
    """


class PeerInputError(PeerError, ValueError):
    """Raised on the ranks whose own input was fine when another rank's input was not (or when
    another rank's kernels failed on its rows in the forward, e.g. an overflowing strength).

    The rank with the bad input raises its own error (ValueError/TypeError naming the argument);
    every other rank raises this one, quoting it, at the same point, so that no rank is left
    waiting in a collective. A ValueError and a `PeerError`.
    """


def group_info(group) -> tuple[int, int]:
    """(rank, world size) of this process in `group` (None: the default group), or a clear error."""
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this PyTorch build")
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: launch with torchrun and call "
            "torch.distributed.init_process_group() first (or use evidential_ops.evidential_loss "
            "for a single process)"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of `group`")
    return rank, dist.get_world_size(group)


def meta_device(group) -> torch.device:
    """Where the small agreement vectors live: CPU for gloo (and mixed cpu:gloo,cuda:nccl groups),
    the current accelerator for NCCL and other device-only backends. The same on every rank, whatever
    a rank's (possibly invalid) input is."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or backend == "mpi":
        return torch.device("cpu")
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        kind = accelerator.current_accelerator()
        return torch.device(kind.type, accelerator.current_device_index())
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# torch >= 2.12 names them *_single; earlier releases (>= 2.4, the package's floor) *_tensor.
def _all_gather_single(output: Tensor, inp: Tensor, group) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, inp, group=group)


def _reduce_scatter_single(output: Tensor, inp: Tensor, group) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output, inp, op=dist.ReduceOp.SUM, group=group)


def all_reduce_sum(t: Tensor, group, *, async_op: bool = False):
    """In-place all-reduce (SUM) of `t` over `group`.

    Args:
        t: a tensor of any shape (here 1-D: (n,) float64 statistics and flags, or (1,)/(2,) of the
            working dtype), on the device of the group's backend (CPU for gloo, the rank's GPU for
            NCCL), with the same shape and dtype on every rank. On return (or once the work
            handle is waited on) every rank's `t` holds the element-wise sum over the ranks.
        group: the process group (None: the default group).
        async_op: return the work handle instead of waiting (`handle.wait()` before reading t).

    Returns None, or the work handle with async_op=True.
    """
    return dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def fail_together(error: BaseException | None, failed: bool, group, *, who: str, what: str,
                  peer_error: type[PeerError] = PeerError) -> None:
    """Raise on every rank once an all-reduced error flag says that some rank failed.

    Args:
        error: this rank's exception (None if it did not fail).
        failed: whether any rank failed (the all-reduced flag, the same on every rank).
        who, what: the function and the step that failed, for the message.
        peer_error: the exception the other ranks raise (a `PeerError`).

    Does nothing when `failed` is False. Otherwise every rank takes part in one all_gather_object
    of the error texts (issued only on this error path) and raises: a failing rank its own
    exception, the others `peer_error` naming the failing ranks and quoting their errors.
    """
    if not failed:
        return
    world = dist.get_world_size(group)
    messages = [None] * world
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}", group=group)
    if error is not None:
        raise error
    quoted = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
    raise peer_error(f"{who}: {what} failed on another rank ({quoted}); no rank finished it")


# ------------------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class Layout:
    """How the global batch is split: rank r owns rows [offsets[r], offsets[r] + sizes[r])."""

    group: object
    rank: int
    world: int
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def padded(self) -> int:
        """K_max: every strip is padded to this many rows in the all-gather and the reduce-scatter."""
        return max(self.sizes)

    @property
    def even(self) -> bool:
        return len(set(self.sizes)) == 1

    @property
    def offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for k in self.sizes:
            out.append(acc)
            acc += k
        return tuple(out)

    @property
    def offset(self) -> int:
        return self.offsets[self.rank]

    @property
    def local(self) -> int:
        return self.sizes[self.rank]


def agree(group, fields: tuple[str, ...], values: dict, error: BaseException | None, *,
          must_match: tuple[str, ...], value_checks: dict[str, str], rows_field: str,
          who: str) -> tuple[Layout, list[dict]]:
    """All-gather each rank's `values` (floats, or 0-D tensors for checks of tensor values) and agree.

    Args:
        fields: the names of the vector's entries (the same tuple on every rank).
        values: this rank's value per field (missing ones, e.g. after a failed check, are NaN).
        error: the exception this rank's own checks raised, or None.
        must_match: fields that must be equal on every rank (options, dtype, D, ...).
        value_checks: field -> message of a 0/1 check of tensor values (1 = passed), evaluated on
            the device without a host sync before the gather.
        rows_field: the field holding K_r.
        who: the function's name, for messages.

    Raises on every rank, at the same point, when any rank's input is bad: the bad rank re-raises
    its own exception, the others a `PeerInputError` quoting it (its text travels in one
    all_gather_object, issued only on this error path).
    """
    rank, world = group_info(group)
    device = meta_device(group)
    vector = torch.full((len(fields),), math.nan, dtype=torch.float64, device=device)
    host = {}
    for i, name in enumerate(fields):
        value = values.get(name)
        if isinstance(value, Tensor):
            vector[i] = value.to(device=device, dtype=torch.float64)
        elif value is not None:
            host[i] = float(value)
    if host:
        index = torch.tensor(list(host), dtype=torch.long, device=device)
        vector.index_copy_(0, index, torch.tensor(list(host.values()), dtype=torch.float64, device=device))
    vector[fields.index("status")] = 0.0 if error is None else 1.0
    table = torch.empty(world * len(fields), dtype=torch.float64, device=device)
    _all_gather_single(table, vector, group)
    rows = [dict(zip(fields, row)) for row in table.view(world, len(fields)).tolist()]

    bad = [r for r, row in enumerate(rows) if row["status"] != 0.0]
    if bad:
        messages = [None] * world
        dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}", group=group)
        if error is not None:
            raise error
        quoted = "; ".join(f"rank {r}: {messages[r]}" for r in bad)
        raise PeerInputError(f"{who}: invalid input on another rank ({quoted}); no rank computed the loss")
    for name, message in value_checks.items():
        failed = [r for r, row in enumerate(rows) if row[name] != 1.0]
        if failed:
            if rank in failed:
                raise ValueError(message)
            raise PeerInputError(f"{who}: invalid input on rank(s) {failed}: {message}")
    for name in must_match:
        seen = [row[name] for row in rows]
        if any(v != seen[0] and not (math.isnan(v) and math.isnan(seen[0])) for v in seen):
            raise ValueError(f"{who}: every rank must pass the same {name}, got {seen} on ranks 0..{world - 1}")
    sizes = tuple(int(row[rows_field]) for row in rows)
    return Layout(group=group, rank=rank, world=world, sizes=sizes), rows


# ------------------------------------------------------------------------------ rows of the batch


def gather_rows(t: Tensor, layout: Layout) -> Tensor:
    """All-gather each rank's (K_r, ...) rows into the (K_global, ...) batch, in rank order."""
    return unpad_rows(all_gather_padded(t, layout), layout)


def all_gather_padded(t: Tensor, layout: Layout) -> Tensor:
    """The collective half of `gather_rows`: this rank's (K_r, ...) rows in, the (K_global, ...)
    batch out when the strips are even, else the (W·K_max, ...) zero-padded strips (`unpad_rows`)."""
    t = t.contiguous()
    rest = tuple(t.shape[1:])
    if layout.even:
        out = t.new_empty((layout.total, *rest))
        _all_gather_single(out, t, layout.group)
        return out
    pad = layout.padded
    buf = t.new_zeros((pad, *rest))
    buf[: t.shape[0]] = t
    out = t.new_empty((layout.world * pad, *rest))
    _all_gather_single(out, buf, layout.group)
    return out


def unpad_rows(out: Tensor, layout: Layout) -> Tensor:
    """The local half of `gather_rows`: the (K_global, ...) batch from `all_gather_padded`'s output."""
    if layout.even:
        return out
    pad = layout.padded
    return torch.cat([out[r * pad: r * pad + k] for r, k in enumerate(layout.sizes)])


def scatter_rows(parts: Tensor, layout: Layout) -> Tensor:
    """Reduce-scatter (SUM): every rank holds a (K_global, ...) tensor of partial sums; rank r gets
    the sum over the ranks of rows [offsets[r], offsets[r] + K_r), i.e. its own rows."""
    return reduce_scatter_buffers(scatter_buffers(parts, layout), layout)


def scatter_buffers(parts: Tensor, layout: Layout) -> tuple[Tensor, Tensor]:
    """The local half of `scatter_rows`: (input, output) buffers of the reduce-scatter, every
    allocation done (the (W·K_max, ...) padded copy of `parts` for uneven strips, the (K_max, ...)
    output), so that what can run out of memory runs before the collective is issued."""
    parts = parts.contiguous()
    rest = tuple(parts.shape[1:])
    if layout.even:
        return parts, parts.new_empty((layout.local, *rest))
    pad = layout.padded
    buf = parts.new_zeros((layout.world, pad, *rest))
    for r, (start, k) in enumerate(zip(layout.offsets, layout.sizes)):
        buf[r, :k] = parts[start: start + k]
    return buf.view(layout.world * pad, *rest), parts.new_empty((pad, *rest))


def reduce_scatter_buffers(buffers: tuple[Tensor, Tensor], layout: Layout) -> Tensor:
    """The collective half of `scatter_rows`: this rank's (K_r, ...) sums from `scatter_buffers`."""
    inp, out = buffers
    _reduce_scatter_single(out, inp, layout.group)
    return out[: layout.local]


# --------------------------------------------------------------------------------------- volume


def communication_volume(sizes, dim: int, *, embedding_dtype: torch.dtype, work_dtype: torch.dtype,
                         num_line_stats: int, num_fields: int, rows: bool, cols: bool, reduction: str,
                         target_scale: bool, need_dx: bool, need_dy: bool) -> dict[str, int]:
    """Bytes one rank hands to each kind of collective in one forward + backward of the fused path.

    Counted as the size of the collective's buffer on this rank: the all-gather output, the
    all-reduce tensor, the reduce-scatter input (a ring moves (W − 1)/W of the all-gather and
    reduce-scatter buffers over the wire and 2(W − 1)/W of the all-reduce one). K = Σ K_r,
    K_max = max K_r, W = len(sizes), e = element sizes. See docs/distributed.md "Communication volume".
    """
    world, k, pad = len(sizes), sum(sizes), max(sizes)
    e_y = torch.empty((), dtype=embedding_dtype).element_size()
    e_w = torch.empty((), dtype=work_dtype).element_size()
    gathered = world * num_fields * 8                    # agreement vector (float64)
    gathered += world * pad * dim * e_y                  # y
    if target_scale:
        gathered += world * pad * 8                      # c (float64)
    reduced = (num_line_stats * k if cols else 0) + (1 if rows and reduction != "none" else 0) + 1
    reduced *= 8                                         # column statistics, Σ row losses, error flag
    scattered = 0
    if need_dx or need_dy:
        if reduction == "none":
            if cols:
                gathered += world * pad * e_w            # upstream gradient of the owned columns
            reduced += e_w                               # the backward's error flag
        else:
            reduced += 2 * e_w                           # upstream gradient of the replicated loss, error flag
        if need_dy:
            scattered += world * pad * dim * e_w         # this rank's part of dy of every column
    return {"all_gather": gathered, "all_reduce": reduced, "reduce_scatter": scattered}


class CommunicationCounter(TorchDispatchMode):
    """Records the bytes of every c10d collective issued while active (per kind, per rank).

    `with CommunicationCounter() as counter: ...` then `counter.bytes` = {"all_gather": n, ...}
    and `counter.calls` = the list of (kind, bytes). It sits at the dispatcher, below
    torch.distributed's Python API, so it sees every collective whoever issues it (DDP's reducer
    calls the process group from C++ and is not seen). Sizes as `communication_volume` counts them.
    """

    KINDS = {
        "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
        "allgather_into_tensor_coalesced_": ("all_gather", 0),
        "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
        "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
        "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
        "broadcast_": ("broadcast", 0), "alltoall_": ("all_to_all", 1), "alltoall_base_": ("all_to_all", 1),
        "gather_": ("gather", 0), "scatter_": ("scatter", 0), "reduce_": ("reduce", 0),
    }

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    @property
    def bytes(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for kind, n in self.calls:
            out[kind] += n
        return dict(out)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            kind, which = self.KINDS.get(name, (name, 0))
            self.calls.append((kind, _tensor_bytes(args[which]) if len(args) > which else 0))
        return func(*args, **kwargs)


def _tensor_bytes(obj) -> int:
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0
