"""Several processes, one model: PyTorch's DistributedDataParallel behind the Trainer's strategy,
one rank per process (``torchrun`` or ``hn.launch``).

Recovery needs the ranks to agree. In plain DDP the gradient all-reduce runs inside ``backward``;
if one rank runs out of memory half-way, the others wait inside that all-reduce for ever. Here
every micro-batch's forward/backward runs under DDP's ``no_sync()`` (no communication while
memory can still run out), then ``settle`` agrees on the whole step in one all-reduce. The cost:
the gradient all-reduce is not overlapped with backward (bench/bench_ddp.py measures it).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hybridnb import failures
from hybridnb.env import current, launch_env
from hybridnb.strategies.base import Strategy
from hybridnb.strategies.batches import ResumableBatchSampler, batch_len


def wants_ddp(strategy) -> bool:
    """Whether ``strategy`` means DDP here: "ddp", or "auto" inside a job of 2+ ranks."""
    if strategy == "ddp":
        return True
    job = launch_env()
    return strategy in ("auto", None) and job is not None and job[2] > 1


def shutdown() -> None:
    """Leave the process group (call once at the end of a torchrun script), after a barrier: a
    rank that tore gloo down while a peer was still sending its last messages could abort at
    exit ("terminate called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(RuntimeError):  # a peer already gone: leave anyway
            dist.barrier()
        dist.destroy_process_group()


def vote(failed: BaseException | None, loss_sum: float = 0.0, n: float = 0.0) -> torch.Tensor:
    """A rank's word on an attempt: (OOM, other failure, loss x samples, samples)."""
    code = 0 if failed is None else (1 if failures.is_oom(failed) else 2)
    return torch.tensor([code == 1, code == 2, loss_sum, n], dtype=torch.float64)


class _Agreed:
    """Marks the error a rank raises because another rank failed (already agreed on)."""


class PeerOutOfMemory(torch.OutOfMemoryError, _Agreed):
    """Another rank ran out of memory in this step: this rank re-runs it split the same way."""


class PeerFailure(RuntimeError, _Agreed):
    """Another rank failed in this step with an error that cannot be recovered."""


class DDPStrategy(Strategy):
    """One rank of a DDP job. ``batch_size`` is per rank: N ranks with batch B train like one
    process with batch N x B. ``device``: "auto"/"cuda" take ``cuda:LOCAL_RANK``, "cpu" gloo."""

    name = "ddp"

    def __init__(self, device: torch.device | str = "auto") -> None:
        job = launch_env()
        if job is None and not dist.is_initialized():
            raise RuntimeError(f"strategy={self.name!r} needs this process to be one rank of a "
                               "multi-process job: start one process per device with torchrun "
                               "(torchrun --nproc_per_node=N script.py) or, from a notebook, "
                               "hn.launch(fn, num_processes=N). RANK and WORLD_SIZE are not "
                               "set here; use strategy='single' for one process")
        rank, local_rank, world = job if job is not None else (
            dist.get_rank(), dist.get_rank(), dist.get_world_size())
        super().__init__(_rank_device(device, local_rank))
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group(self.backend, init_method="env://", rank=rank,
                                    world_size=world,
                                    device_id=self.device if self.backend == "nccl" else None)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self._module: torch.nn.Module | None = None
        self._agreed = False  # settle() ran its all-reduce for the attempt that is failing

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """DDP copies rank 0's parameters to all ranks; buffers are not broadcast before every
        forward (DDP's default): ``settle`` averages them after every step."""
        self._module = model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def batch_sampler(self, n: int, batch_size: int, shuffle: bool,
                      generator: torch.Generator) -> ResumableBatchSampler:
        """Rank 0's generator state is broadcast first: all ranks draw the same order."""
        if shuffle:
            state = generator.get_state().to(self._comm)
            dist.broadcast(state, src=0)
            generator.set_state(state.cpu())
        return super().batch_sampler(n, batch_size, shuffle, generator)

    def no_sync(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """The last micro-step too: gradients are averaged in ``settle``, once all ranks know
        the step succeeded."""
        return model.no_sync() if isinstance(model, DistributedDataParallel) else \
            contextlib.nullcontext()

    def on_cpu(self):
        raise RuntimeError(
            f"rank {self.rank} lost {self.device}; one rank of a multi-process job cannot go on "
            "alone on the CPU. The last good state is in checkpoint_dir (written by rank 0): "
            "restart the job (torchrun --max-restarts=N restarts it for you) with "
            "fit(..., resume=True), without the failed GPU (CUDA_VISIBLE_DEVICES)")

    def settle(self, params: list[torch.Tensor], total: torch.Tensor | None, window: list,
               failed: BaseException | None = None) -> torch.Tensor | None:
        """One all-reduce per attempt on every rank: who failed, the loss, every gradient (x
        this rank's samples, so 2 ranks x batch B equal 1 process x batch 2B) and every
        floating-point buffer (averaged). When a rank failed, one that did not raises
        ``PeerOutOfMemory``/``PeerFailure``: every rank takes the same recovery branch (the OOM
        split re-runs the step the same way). Otherwise every rank gets the global batch's mean
        gradient and loss, so the loss guard, clipping and the optimizer decide the same."""
        if failed is not None and (isinstance(failed, _Agreed) or self._agreed):
            self._agreed = False  # this failure came after the all-reduce: already agreed on
            return None
        buffers = [b for b in self._module.buffers() if b.is_floating_point()]  # set by wrap()
        n = float(sum(batch_len(b) for b in window))
        head = vote(failed) if failed else vote(None, float(total) * n, n)
        sizes = [4, len(params), sum(p.numel() for p in params), sum(b.numel() for b in buffers)]
        if failed is None:
            flat = torch.cat([t.to(self._comm, torch.float32) for t in [
                head, torch.tensor([float(p.grad is not None) for p in params]),
                *(p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel())
                  for p in params),
                *(b.reshape(-1) for b in buffers)]])
            flat[sum(sizes[:2]):sum(sizes[:3])].mul_(n)
            flat[sum(sizes[:3]):].div_(self.world_size)
        else:  # this rank's gradients are partial: it sends zeros
            flat = torch.zeros(sum(sizes), device=self._comm)
            flat[:4] = head.to(self._comm)
        dist.all_reduce(flat)
        self._agreed = True
        head_part, present, grads, buf_part = flat.split(sizes)
        ooms, others, loss_sum, count = head_part.tolist()
        if self._peer_verdict(ooms, others, failed):
            self._agreed = False
            return None
        grads.div_(count)
        for p, g, have in zip(params, grads.split([p.numel() for p in params]),
                              present.tolist(), strict=True):
            # None: no rank computed a gradient for it (an unused parameter); copied into the
            # parameter's own gradient, not a view of the buffer: that keeps its device (the
            # buffer may be on the CPU under gloo), dtype and layout (channels_last weights)
            if not have:
                p.grad = None
            elif p.grad is None:  # this rank did not use it, another did
                p.grad = torch.empty_like(p).copy_(g.view_as(p))
            else:
                p.grad.copy_(g.view_as(p))
        for b, v in zip(buffers, buf_part.split([b.numel() for b in buffers]), strict=True):
            b.copy_(v.view_as(b))
        self._agreed = False
        return total.new_tensor(loss_sum / count)

    def _peer_verdict(self, ooms: float, others: float, failed: BaseException | None) -> bool:
        """True on a rank that failed itself; raises on one that did not; False if none did."""
        if not (ooms or others):
            return False
        mine = None if failed is None else f"{type(failed).__name__}: {failures.first_line(failed)}"
        notes: list[str | None] = [None] * self.world_size
        dist.all_gather_object(notes, mine)  # every rank: 'rank 1 failed (CUDA out of memory...)'
        said = "; ".join(f"rank {r} failed ({note})" for r, note in enumerate(notes) if note)
        if failed is not None:
            return True
        if others:
            raise PeerFailure(f"{said}; rank {self.rank} stops too")
        raise PeerOutOfMemory(f"{said}; every rank re-runs the step split the same way")

    def agree(self, flag: bool) -> bool:
        return self.sum([float(flag)])[0] > 0

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """In rank order; sizes may differ (all_gather_object pads and cuts for us)."""
        parts = [None] * self.world_size
        dist.all_gather_object(parts, tensor.detach().cpu())
        return torch.cat(parts).to(tensor.device)

    def barrier(self) -> None:
        dist.barrier(device_ids=[self.device.index] if self.backend == "nccl" else None)


def _rank_device(device, local_rank: int) -> torch.device:
    """This rank's device. One process per GPU: rank with LOCAL_RANK k uses cuda:k (or cuda:0
    when each process sees a single GPU through CUDA_VISIBLE_DEVICES)."""
    if device in ("auto", None):  # a strategy object the user made: the Trainer's is resolved
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device={str(device)!r}: DDP runs on CUDA/ROCm GPUs (NCCL) or on the "
                         "CPU (gloo)")
    count = torch.cuda.device_count()
    index = local_rank if local_rank < count else 0 if count == 1 else None
    if index is None:
        raise RuntimeError(f"LOCAL_RANK={local_rank} but this process sees {count} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES={current().get('CUDA_VISIBLE_DEVICES')!r}); "
                           f"NCCL needs one GPU per process: start at most {count} processes "
                           "per machine")
    if device.index is not None and device.index != index:
        raise RuntimeError(f"rank with LOCAL_RANK={local_rank} should use cuda:{index}, but "
                           f"device={str(device)!r} was chosen (hn.detect() picks another GPU "
                           "when this rank's GPU fails its probe); every rank needs its own "
                           "working GPU, so leave that GPU out with CUDA_VISIBLE_DEVICES and "
                           "start one process fewer")
    return torch.device("cuda", index)
