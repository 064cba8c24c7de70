"""How a tensor-parallel group sums its ranks' partial outputs: the process group's own
all-reduce (NCCL, gloo), or, for the small messages of decode, a one-shot all-reduce over
symmetric memory (``torch.distributed._symmetric_memory``): each rank's part is copied
into a buffer every peer maps over NVLink, the ranks meet at a barrier, and each reads
every part and sums them — one kernel, where NCCL's ring pays 10–20 µs of latency on a
16 KB message. docs/tensor-parallel.md says when each path runs.

Every rank must take the same path for the same call, or one waits in a collective the
other never enters. So the path is decided only from what the ranks hold alike: the
message's size and dtype, the group's device type and backend, the torch build, and the
buffers made so far (every rank makes them in the same calls). Whether symmetric memory
works at all is agreed once, when the first buffer is made: every rank tries, then an
all-reduce of the outcomes tells all of them the same answer.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch

from ..errors import ShardError

__all__ = [
    "ONE_SHOT_DTYPES",
    "ONE_SHOT_MAX_BYTES",
    "PATHS",
    "AllReducer",
    "OneShot",
    "SymmetricMemory",
    "choose_path",
    "one_shot_refusal",
]

#: What a group may be told: its backend's all-reduce always, one-shot always (refusing
#: what it cannot sum), or one-shot for small messages where it can run.
PATHS = ("backend", "one_shot", "auto")

#: ``"auto"`` takes one-shot for messages up to this many bytes. One-shot has each rank
#: read all W−1 peers' whole messages, where NCCL's ring moves 2(W−1)/W of one message per
#: rank; below a few hundred KB latency sets the time (NCCL's 10–20 µs against one
#: kernel's few µs), above it the extra reads catch up. 256 KB holds the decode messages
#: of a 70B-class model (up to 16 rows of hidden 8192 in bf16) and leaves prefill's (128
#: rows: 2 MB) to NCCL; ``quantcore bench tp_linear`` times both paths at M = 1, 16, 128.
ONE_SHOT_MAX_BYTES = 256 * 1024

#: The dtypes torch's one-shot kernel sums.
ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)
#: The kernel's vector loads need a message of a multiple of 4 bytes, and an input that
#: starts as aligned as the buffer (16 bytes); an input that does not is copied first.
_SIZE_ALIGN = 4
_START_ALIGN = 16
#: The most message shapes a group keeps bound (each a view of a buffer; a model's
#: decode and prefill shapes are far fewer); past it they are bound again from scratch.
MAX_BOUND = 256


class OneShot(Protocol):
    """The one-shot sum bound to a group: ``out`` = the sum over the group of every rank's
    ``src``, staged through ``buffer`` (a view of a rendezvoused buffer, ``src``'s shape)."""

    def __call__(self, buffer: torch.Tensor, src: torch.Tensor, *, out: torch.Tensor) -> object: ...


def one_shot_refusal(nbytes: int, dtype: torch.dtype) -> str:
    """Why the one-shot kernel cannot sum a message of ``nbytes`` in ``dtype`` ("" when it can)."""
    if dtype not in ONE_SHOT_DTYPES:
        return f"dtype {dtype}: the one-shot kernel sums {', '.join(map(str, ONE_SHOT_DTYPES))} only"
    if nbytes % _SIZE_ALIGN:
        return f"a message of {nbytes} bytes: the one-shot kernel needs a multiple of {_SIZE_ALIGN}"
    return ""


def choose_path(path: str, *, nbytes: int, dtype: torch.dtype, unavailable: str) -> str:
    """``"backend"`` or ``"one_shot"`` for one message, from what every rank holds alike: the
    group's ``path`` (one of :data:`PATHS`), the message's bytes and dtype, and why
    symmetric memory cannot run for this group ("" when it can). A forced one-shot that
    cannot run raises :class:`ShardError` (on every rank alike)."""
    if path == "backend":
        return "backend"
    why = unavailable or one_shot_refusal(nbytes, dtype)
    if path == "one_shot":
        if why:
            raise ShardError(f"TPGroup all_reduce_path='one_shot': {why}")
        return "one_shot"
    return "backend" if why or nbytes > ONE_SHOT_MAX_BYTES else "one_shot"


def _group_name(group: Any) -> str:
    import torch.distributed as dist

    chosen = group if group is not None else dist.group.WORLD
    if chosen is None:
        raise ShardError("all-reduce: torch.distributed is not initialised (call init_process_group first)")
    return str(chosen.group_name)


class SymmetricMemory:
    """The calls the one-shot path makes into torch, in one place (a test stands in a fake).
    Only what torch 2.11 and later share: ``symm_mem.empty``, ``symm_mem.rendezvous`` and
    the ``one_shot_all_reduce_copy_out`` op (bound once per group: :meth:`bind_one_shot`);
    never a multicast one."""

    OP = "one_shot_all_reduce_copy_out"

    def unavailable(self) -> str:
        try:
            import torch.distributed._symmetric_memory
        except ImportError as exc:
            return f"torch.distributed._symmetric_memory cannot be imported ({exc})"
        if not hasattr(torch.ops.symm_mem, self.OP):
            return f"torch {torch.__version__} has no torch.ops.symm_mem.{self.OP}"
        return ""

    def empty(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        import torch.distributed._symmetric_memory as symm_mem

        return symm_mem.empty(numel, dtype=dtype, device=device)

    def rendezvous(self, buffer: torch.Tensor, group: Any) -> object:
        """Map ``buffer`` on every rank of ``group`` (a collective)."""
        import torch.distributed._symmetric_memory as symm_mem

        name: Any = _group_name(group)  # torch types the name as its GroupName alias of str
        return symm_mem.rendezvous(buffer, name)

    def agree(self, ok: bool, device: torch.device, group: Any) -> bool:
        """True when every rank of ``group`` says ``ok`` (a collective)."""
        import torch.distributed as dist

        flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item())

    def bind_one_shot(self, group: Any) -> OneShot:
        """The one-shot sum over ``group`` with what it looks up found once: the op's
        overload and the group's name (a call is then the op's call)."""
        op = getattr(torch.ops.symm_mem, self.OP).default
        return functools.partial(op, reduce_op="sum", group_name=_group_name(group))


_NOT_INITIALISED = "torch.distributed is not initialised"


def _concrete(device: torch.device | str) -> torch.device:
    """``cuda`` as the index tensors report (``cuda:0``), so both name one buffer."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class AllReducer:
    """A group's all-reduce along one of :data:`PATHS` (a :class:`~.parallel.TPGroup`
    holds one). One-shot buffers are made once per (dtype, device, capacity), kept for the
    group's life (a captured graph may hold them), and a message takes the smallest that
    holds it. Making one is a collective (the rendezvous), so it cannot happen inside a
    CUDA-graph capture: :meth:`prepare` makes it before.

    A message's path and its view of the buffer depend only on its shape, dtype and
    device and on what the group holds (buffers, refusals): they are bound on the first
    message of a shape and kept until the group's buffers or refusals change, so a call
    is a lookup, the alignment check of its input, its output and the op's call."""

    def __init__(self, path: str, *, group: Any = None, stage_on_host: bool = False,
                 symm: SymmetricMemory | None = None) -> None:
        if path not in PATHS:
            raise ShardError(f"TPGroup all_reduce_path: expected one of {PATHS}, got {path!r}")
        if path == "one_shot" and stage_on_host:
            raise ShardError("TPGroup all_reduce_path='one_shot' reads device memory; stage_on_host=True "
                             "all-reduces a host copy: choose one")
        self.path, self.group, self.stage_on_host = path, group, stage_on_host
        self._symm = symm or SymmetricMemory()
        self._buffers: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        self._handles: list[object] = []
        #: Per device, why the one-shot path cannot run ("" when it can), once known: from
        #: what this rank sees, then from what the ranks agreed at the first rendezvous.
        self._why: dict[torch.device, str] = {}
        #: Per message (shape, dtype, device) whose path is settled: the buffer's view it
        #: is staged through on the one-shot path, None on the backend's.
        self._bound: dict[tuple[torch.Size, torch.dtype, torch.device], torch.Tensor | None] = {}
        self._run_one_shot: OneShot | None = None

    def unavailable(self, device: torch.device) -> str:
        """Why the one-shot path cannot run for this group on ``device`` ("" when, as far as
        is known, it can): the same answer on every rank. Asked once per device (the
        per-call path stays a dictionary look-up), except before torch.distributed is up."""
        if device not in self._why:
            why = self._local_unavailable(device)
            if why == _NOT_INITIALISED:
                return why
            self._why[device] = why
            self._bound.clear()
        return self._why[device]

    def _local_unavailable(self, device: torch.device) -> str:
        if self.stage_on_host:
            return "the group all-reduces a host copy (stage_on_host)"
        if device.type != "cuda":
            return f"the tensors are on {device.type}: the one-shot all-reduce needs CUDA"
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return _NOT_INITIALISED
        backend = str(dist.get_backend(self.group))
        if "nccl" not in backend:
            return f"the process group's backend is {backend}: the one-shot path runs on NCCL groups"
        return self._symm.unavailable()

    def path_for(self, numel: int, dtype: torch.dtype, device: torch.device | str) -> str:
        """The path a message of ``numel`` elements in ``dtype`` on ``device`` takes."""
        device = _concrete(device)
        unavailable = self.unavailable(device) if self.path != "backend" else ""
        return choose_path(self.path, nbytes=numel * dtype.itemsize, dtype=dtype, unavailable=unavailable)

    def prepare(self, numel: int, dtype: torch.dtype, device: torch.device | str) -> str:
        """Make, outside any capture, the buffer that messages of up to ``numel`` elements
        taking one-shot need; return the path the largest takes. Every rank calls it alike
        (a collective). Under ``"auto"`` the buffer holds ``ONE_SHOT_MAX_BYTES`` whatever
        ``numel`` is: the largest message may go to the backend while smaller ones do not."""
        device = _concrete(device)
        if self.path == "auto" and not self.unavailable(device) and dtype in ONE_SHOT_DTYPES:
            self._buffer(min(numel, ONE_SHOT_MAX_BYTES // dtype.itemsize), dtype, device)
        elif self.path == "one_shot" and self.path_for(numel, dtype, device) == "one_shot":  # raises where it cannot
            self._buffer(numel, dtype, device)
        return self.path_for(numel, dtype, device)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over the group: ``t`` itself, summed in place, on the backend's
        path; a new tensor on the one-shot path."""
        key = (t.shape, t.dtype, t.device)
        staged = self._bound[key] if key in self._bound else self._bind(t, key)
        return self._backend(t) if staged is None else self._one_shot(t, staged)

    def _bind(self, t: torch.Tensor, key: tuple[torch.Size, torch.dtype, torch.device]) -> torch.Tensor | None:
        """The view of the buffer a message like ``t`` is staged through (None: the
        backend's path), kept for the next once the group's answer for its device is
        settled (not while torch.distributed is not yet up)."""
        staged = None
        if self.path_for(t.numel(), t.dtype, t.device) == "one_shot":
            buffer = self._buffer(t.numel(), t.dtype, t.device)
            if buffer is not None:
                staged = buffer[: t.numel()].view(t.shape)
        if self.path == "backend" or t.device in self._why:
            if len(self._bound) >= MAX_BOUND:
                self._bound.clear()
            self._bound[key] = staged
        return staged

    def _buffer(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The smallest buffer holding ``numel`` elements, made if there is none (every rank
        alike); None where the ranks agreed symmetric memory does not work (auto)."""
        held = [b for b in self._buffers.get((dtype, device), ()) if b.numel() >= numel]
        if held:
            return min(held, key=lambda b: b.numel())
        if _capturing(device):
            raise ShardError(
                f"TPGroup all-reduce: a one-shot message of {numel} {dtype} elements on {device} needs a "
                "symmetric buffer, and making one (a rendezvous of the ranks) cannot be captured in a CUDA "
                "graph: call prepare_all_reduce(max_tokens, ...) with the largest M before capturing")
        capacity = max(numel, ONE_SHOT_MAX_BYTES // dtype.itemsize)
        buffer, why = None, ""
        try:
            buffer = self._symm.empty(capacity, dtype, device)
            self._handles.append(self._symm.rendezvous(buffer, self.group))
        except Exception as exc:  # a driver or topology without peer access: agreed on below, then reported
            buffer, why = None, f"symmetric memory on {device} failed: {type(exc).__name__}: {exc}"
        self._bound.clear()  # a refusal or a new buffer may change a bound message's path or view
        if not self._symm.agree(buffer is not None, device, self.group):
            self._why[device] = why or "symmetric memory failed on another rank of the group"
            if self.path == "one_shot":
                raise ShardError(f"TPGroup all_reduce_path='one_shot': {self._why[device]}")
            return None
        assert buffer is not None  # every rank, this one included, said ok
        self._buffers.setdefault((dtype, device), []).append(buffer)
        if self._run_one_shot is None:
            self._run_one_shot = self._symm.bind_one_shot(self.group)
        return buffer

    def _one_shot(self, t: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
        """The one-shot sum of ``t`` through ``staged`` (a view of ``t``'s shape)."""
        aligned = t.is_contiguous() and (t.storage_offset() * t.element_size()) % _START_ALIGN == 0
        src = t if aligned else t.clone(memory_format=torch.contiguous_format)
        out = torch.empty_like(src)
        assert self._run_one_shot is not None  # bound with the first buffer
        self._run_one_shot(staged, src, out=out)
        return out

    def _backend(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.stage_on_host and t.device.type != "cpu":
            host = t.cpu()
            dist.all_reduce(host, group=self.group)
            t.copy_(host)
        else:
            dist.all_reduce(t, group=self.group)
        return t
