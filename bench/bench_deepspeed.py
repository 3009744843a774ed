"""DeepSpeed ZeRO-2 vs DDP through the same Trainer: time per step and optimizer memory per rank.

Two CPU processes (gloo on 127.0.0.1, started by hn.launch) each hold one Trainer per strategy,
with the same model, data (random 129 x 200 windows), batch 16 per rank and AdamW. The variants
alternate (ddp, deepspeed, ddp, ...) for ``ROUNDS`` rounds of ``STEPS`` optimizer steps each
(``fit`` with ``steps_per_epoch``, no validation); the table gives the median milliseconds per
step of rank 0 and the AdamW state each rank holds (ZeRO-2 keeps only its partition's moments).
ShallowFBCSPNet is EEG-sized; an MLP with ~10M parameters shows the memory split on a model
whose optimizer state is large. Run: ``.venv/bin/python -m bench.bench_deepspeed``.
"""

from __future__ import annotations

import os
import time
import warnings

import torch
from torch import nn

from bench.common import load_note, markdown_table, median, spread, write_result

BATCH, CHANS, TIMES = 16, 129, 200
ROUNDS, STEPS = 5, 4
MODELS = ("ShallowFBCSPNet", "MLP 10M")


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "MLP 10M":
        return nn.Sequential(nn.Flatten(), nn.Linear(CHANS * TIMES, 384), nn.ReLU(),
                             nn.Linear(384, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from braindecode.models import ShallowFBCSPNet

        return ShallowFBCSPNet(n_chans=CHANS, n_outputs=1, n_times=TIMES,
                               final_conv_length="auto")


def _state_bytes(trainer) -> int:
    """Bytes of AdamW moments this rank holds."""
    opt = trainer.strategy.engine.optimizer.optimizer if trainer.strategy.name == "deepspeed" \
        else trainer.optimizer
    return sum(t.numel() * t.element_size() for s in opt.state.values()
               for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def _rank_worker() -> list[dict]:
    from hybridnb.train.trainer import Trainer

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH * 2 * STEPS, CHANS, TIMES, generator=g)
    y = torch.randn(len(x), generator=g)
    rows = []
    for kind in MODELS:
        trainers = {name: Trainer(make_model(kind), strategy=name, device="cpu", lr=1e-3,
                                  batch_size=BATCH, grad_accum=1, epochs=1, seed=0, live=False,
                                  verbose=False, steps_per_epoch=STEPS, precision="fp32")
                    for name in ("ddp", "deepspeed")}
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for tr in trainers.values():  # warm-up: first-step allocations, DeepSpeed's buffers
            tr.fit((x, y))
        for _ in range(ROUNDS):
            for name, tr in trainers.items():
                tr.strategy.barrier()
                t0 = time.perf_counter()
                tr.fit((x, y))
                times[name].append((time.perf_counter() - t0) / STEPS * 1e3)
        params = sum(p.numel() for p in trainers["ddp"].model.parameters())
        rows.append({"kind": kind, "params": params, "times": times,
                     "bytes": {n: _state_bytes(t) for n, t in trainers.items()}})
    return rows


def main() -> None:
    from hybridnb.strategies.launch import launch

    load0 = os.getloadavg()[0]
    make_model("ShallowFBCSPNet")  # import braindecode once, before the workers are forked
    results = launch(_rank_worker, num_processes=2)
    table, ratios, halves = [], [], []
    for r in results:
        ddp, zero = r["times"]["ddp"], r["times"]["deepspeed"]
        ratio = median([z / d for z, d in zip(zero, ddp, strict=True)])  # same round
        share = r["bytes"]["deepspeed"] / r["bytes"]["ddp"]
        ratios.append(ratio)
        halves.append(share)
        table.append({
            "model": r["kind"], "params": r["params"],
            "ddp ms/step": median(ddp), "ddp spread": spread(ddp),
            "deepspeed ms/step": median(zero), "deepspeed spread": spread(zero),
            "deepspeed / ddp time": ratio,
            "AdamW state per rank, ddp (MiB)": r["bytes"]["ddp"] / 2**20,
            "AdamW state per rank, deepspeed (MiB)": r["bytes"]["deepspeed"] / 2**20,
            "state share": share,
        })
    body = (__doc__.split("\n\n", 1)[1] + "\n" + markdown_table(table) + "\n"
            + load_note(load0) + "\n\nGPU (NCCL) numbers: not measured here (no GPU was lent "
            "to this project).\n")
    write_result("deepspeed", "DeepSpeed ZeRO-2 vs DDP through the Trainer (2 CPU ranks, gloo)",
                 body, goals=[("ZeRO-2 holds at most ~half the AdamW state per rank of 2",
                               max(halves) <= 0.55),
                              ("ZeRO-2 step time within 1.25x of DDP on the CPU",
                               max(ratios) <= 1.25)])


if __name__ == "__main__":
    main()
