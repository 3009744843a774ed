"""What the cross-rank agreement costs: the Trainer's DDP step protocol vs plain DDP.

Two CPU processes (gloo on 127.0.0.1, started by hn.launch) train the same model on the same
random (129 channels x 200 samples) windows, batch 16 per process, AdamW, loss read every step:

- plain DDP: ``loss.backward()`` with DDP's bucketed all-reduce overlapped with backward (DDP's
  defaults, broadcast_buffers=True);
- agreed (hybridnb): backward under ``no_sync()``, then ``settle`` (one all-reduce of who
  failed, the loss, every gradient and float buffer) and the per-step stop check (one all-reduce
  of 2 numbers), as ``Trainer`` does under ``strategy="ddp"``.

Variants alternate (plain, agreed, plain, ...) inside the same two processes; the table gives the
median time per step over rounds (rank 0's clock). ShallowFBCSPNet is an EEG-sized model. On this
shared 2-core host its step time varies by tens of percent between rounds, which hides a
millisecond, so a near-free MLP with the same number of parameters (the same gradient all-reduce)
measures the protocol's cost per step where nothing hides it; that cost is then projected onto
ShallowFBCSPNet's step time. Run: ``.venv/bin/python -m bench.bench_ddp`` (under a minute).
"""

from __future__ import annotations

import os
import time
import warnings

import torch
from torch import nn

from bench.common import load_note, markdown_table, median, spread, write_result

BATCH, CHANS, TIMES = 16, 129, 200
ROUNDS = 7
STEPS = {"shallow": 6, "mlp": 100}


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(CHANS * TIMES // 100, 800), nn.ReLU(),  # ~ShallowFBCSPNet's
                             nn.Linear(800, 1))  # parameter count, almost no compute
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from braindecode.models import ShallowFBCSPNet

        return ShallowFBCSPNet(n_chans=CHANS, n_outputs=1, n_times=TIMES,
                               final_conv_length="auto")


def _rank_worker(kinds: list[str]) -> list[dict]:
    """Runs in each of the 2 ranks; returns rank 0's per-step times."""
    from hybridnb.strategies.ddp import DDPStrategy

    strategy = DDPStrategy("cpu")
    torch.set_num_threads(1)
    return [_measure(strategy, kind) for kind in kinds]


def _measure(strategy, kind: str) -> dict:
    """Milliseconds per step of both variants, alternated, ``ROUNDS`` rounds."""
    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(strategy.rank)
    shape = (BATCH, CHANS, TIMES) if kind == "shallow" else (BATCH, CHANS * TIMES // 100)
    x, y = torch.randn(*shape, generator=g), torch.randn(BATCH, 1, generator=g)
    plain_model, agreed_model = make_model(kind), make_model(kind)
    plain = DistributedDataParallel(plain_model)
    params = [p for p in agreed_model.parameters() if p.requires_grad]
    opt_plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-3)
    opt_agreed = torch.optim.AdamW(params, lr=1e-3)
    agreed = strategy.wrap(agreed_model, opt_agreed)
    loss_fn = nn.MSELoss()

    def plain_step():
        loss = loss_fn(plain(x).reshape(BATCH, 1), y)
        loss.backward()
        float(loss)
        opt_plain.step()
        opt_plain.zero_grad(set_to_none=True)

    def agreed_step():  # what Trainer._step + _after_step do under strategy="ddp"
        with strategy.no_sync(agreed, last=True):
            loss = loss_fn(agreed(x).reshape(BATCH, 1), y)
            loss.backward()
        total = strategy.settle(params, loss.detach(), [(x, y)])
        float(total)
        opt_agreed.step()
        opt_agreed.zero_grad(set_to_none=True)
        strategy.sum([0.0, 0.0])

    variants = {"plain DDP": plain_step, "agreed (hybridnb)": agreed_step}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up (allocator, DDP's first iteration)
        fn()
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            strategy.barrier()
            t0 = time.perf_counter()
            for _ in range(STEPS[kind]):
                fn()
            times[name].append((time.perf_counter() - t0) / STEPS[kind] * 1e3)
    return {"kind": kind, "params": sum(p.numel() for p in params), **times}


def main() -> None:
    from hybridnb.strategies.launch import launch

    load0 = os.getloadavg()[0]
    make_model("shallow")  # import braindecode once, before the workers are forked
    results = launch(_rank_worker, list(STEPS), num_processes=2)
    rows = []
    for r in results:
        plain, agreed = r["plain DDP"], r["agreed (hybridnb)"]
        extra = [a - p for a, p in zip(agreed, plain, strict=True)]  # same round, side by side
        rows.append({
            "model": "ShallowFBCSPNet" if r["kind"] == "shallow" else "near-free MLP",
            "params": r["params"],
            "plain DDP ms/step": median(plain), "plain spread": spread(plain),
            "agreed ms/step": median(agreed), "agreed spread": spread(agreed),
            "extra ms/step (median of rounds)": median(extra),
            "extra %": 100 * median(extra) / median(plain),
        })
    shallow, mlp = rows
    projected = 100 * mlp["extra ms/step (median of rounds)"] / shallow["plain DDP ms/step"]
    body = (__doc__.split("\n\n", 1)[1] + "\n" + markdown_table(rows)
            + f"\nProjected cost of the agreement on ShallowFBCSPNet: "
            f"{mlp['extra ms/step (median of rounds)']:.2f} ms per step = {projected:.1f}% of its "
            f"{shallow['plain DDP ms/step']:.0f} ms step.\n\n" + load_note(load0)
            + "\n\nGPU (NCCL) numbers: not measured here (no GPU on this machine).\n")
    write_result("ddp", "DDP: the Trainer's agreement protocol vs plain DDP (2 CPU ranks, gloo)",
                 body, goals=[("agreement costs under 5% of an EEG-sized model's step on the CPU "
                               "(projected from the near-free MLP)", projected < 5.0),
                              ("single-GPU torchrun --nproc_per_node=1 with NCCL", None)])


if __name__ == "__main__":
    main()
