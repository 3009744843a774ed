"""Train one model on several GPUs (or CPU processes) with DDP, started by torchrun.

    torchrun --nproc_per_node=4 examples/train_ddp.py                  # 4 GPUs, NCCL
    torchrun --nproc_per_node=2 examples/train_ddp.py --device cpu     # 2 CPU processes, gloo
    torchrun --nproc_per_node=1 examples/train_ddp.py --strategy ddp   # DDP on one GPU (NCCL)
    torchrun --nproc_per_node=4 examples/train_ddp.py --strategy deepspeed  # ZeRO-2 (DeepSpeed)

On several machines, start the same command on each with ``--nnodes=M --node_rank=K
--master_addr=<node 0's address> --master_port=<free port>`` (the checkpoint folder must be
shared: every rank reads it on resume).

The data is a small synthetic EEG-like regression task (windows of 129 channels x 200 samples,
Challenge 1's shape, target = the power of a few channels), the same on every rank; the Trainer
gives each rank its share of every batch. ``--batch-size`` is per process: N processes train like
one process with N times the batch. Only rank 0 prints progress and writes checkpoints; with
``--resume`` a restarted job continues from the last checkpoint (e.g. under
``torchrun --max-restarts=2``).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import hybridnb as hn
from hybridnb.strategies.ddp import shutdown


def synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows (n, 129, 200) whose target is the log power of channels 0-7 (learnable by a
    convolution, an average and a linear layer)."""
    g = torch.Generator().manual_seed(seed)
    gain = torch.exp(torch.randn(n, 1, 1, generator=g) * 0.5)
    x = torch.randn(n, 129, 200, generator=g)
    x[:, :8] *= gain
    y = torch.log(x[:, :8].pow(2).mean(dim=(1, 2)))
    return x, (y - y.mean()) / y.std()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(129, 16, kernel_size=9), nn.GELU(), nn.Conv1d(16, 16, 1),
                         nn.GELU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategy", default="auto", help="auto | ddp | deepspeed | single (default: auto)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32, help="per process")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--out", default="runs/ddp_example", help="checkpoint folder")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)

    train, val = synthetic(args.samples, seed=0), synthetic(max(64, args.samples // 4), seed=1)
    tr = hn.Trainer(model(), strategy=args.strategy, device=args.device, lr=1e-2,
                    batch_size=args.batch_size, grad_accum=1, epochs=args.epochs, seed=0,
                    checkpoint_dir=args.out, live="text")
    tr.fit(train, val, resume=args.resume)
    metrics = tr.evaluate(val)  # every rank evaluates its shard; the metrics are global
    s = tr.strategy
    if s.is_main:
        backend = getattr(s, "backend", "none")
        print(f"done: strategy {s.name}, {s.world_size} process(es), backend {backend}, "
              f"device {tr.device}; val rmse {metrics['rmse']:.4f}, nrmse {metrics['nrmse']:.4f}; "
              f"checkpoints in {args.out}", flush=True)
    shutdown()


if __name__ == "__main__":
    main()
