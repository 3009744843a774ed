"""CPU speedups: every zoo model's CPU training speed without and with apply_speedups' CPU
decision, and EEGNeX through hn.Trainer against the stock hand-written loop.

Part 1: each model of ``hybridnb_tools.models`` trains (fp32, batch 32, AdamW + MSE, random
129 x 200 windows) in two copies, stock and after ``apply_speedups(model, x, "cpu")`` (the CPU's
decision: its rules, channels_last where a paired trial on the batch measures it 5 % faster
(up to ``decide.CL_TRIAL_S``; no run length is given here), bf16 only where the CPU has it), in
interleaved rounds (stock, sped up, stock, ...); samples/s per round, the ratio paired per round,
medians. Goal: no zoo model slower (ratio >= 0.97, given this host's noise).

Part 2: EEGNeX through ``hn.Trainer`` with its defaults (live=False, device="cpu") against the
stock hand-written fp32 eager loop (AdamW, mse, zero_grad/backward/step) on the same data, side
by side, whole runs (set-up included) interleaved: the default ``speedups="auto"`` (the CPU's
rules) and ``speedups=True`` (every knob tried). Goal: the default >= 2x the loop.

    .venv/bin/python -m bench.bench_cpu_speedups          # a few minutes on 2 cores
    HYBRIDNB_QUICK=1 .venv/bin/python -m bench.bench_cpu_speedups   # tiny, prints only
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings

import torch
from torch import nn

from bench.common import interleaved, load_note, markdown_table, median, spread, write_result
from hybridnb import env

BATCH = 32
NOT_SLOWER = 0.97  # ratio counted as "not slower" on this noisy shared host
TRAINER_GOAL = 2.0


def zoo() -> dict:
    from hybridnb_tools.models import MODELS

    return MODELS


def build(factory) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return factory()


def batches(factory, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    chans, times = factory.input_shape
    return torch.randn(BATCH * steps, chans, times, generator=g), torch.randn(BATCH * steps,
                                                                              generator=g)


class Copy:
    """One model copy with its optimizer; ``round()`` trains ``steps`` batches, returns samples/s."""

    def __init__(self, factory, x, y, sped_up: bool) -> None:
        from hybridnb.speedups import apply_speedups

        self.model = build(factory).train()
        self.applied = apply_speedups(self.model, x[:BATCH], "cpu") if sped_up else None
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.x, self.y = x, y
        self.step(0)  # first step outside the timings (oneDNN primitives, layouts)

    def step(self, k: int) -> None:
        xb, yb = self.x[k * BATCH:(k + 1) * BATCH], self.y[k * BATCH:(k + 1) * BATCH]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._bf16):
            out = self.model(xb)
        loss = nn.functional.mse_loss(out.float().reshape(-1), yb)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    @property
    def _bf16(self) -> bool:
        return self.applied is not None and self.applied.precision == "bf16"

    def round(self) -> float:
        steps = len(self.x) // BATCH
        t0 = time.perf_counter()
        for k in range(steps):
            self.step(k)
        return BATCH * steps / (time.perf_counter() - t0)


def part1(steps: int, rounds: int) -> tuple[list[dict], list[tuple[str, bool]]]:
    rows, goals = [], []
    for name, factory in zoo().items():
        x, y = batches(factory, steps)
        t0 = time.perf_counter()
        stock = Copy(factory, x, y, sped_up=False)
        t1 = time.perf_counter()
        fast = Copy(factory, x, y, sped_up=True)
        decide_s = fast.applied.seconds
        print(f"  {name}: {fast.applied.message} (stock set-up {t1 - t0:.1f} s)", flush=True)
        rates = interleaved({"stock": stock.round, "sped up": fast.round}, repeats=rounds)
        ratios = [b / a for a, b in zip(rates["stock"], rates["sped up"], strict=True)]
        ratio = median(ratios)
        rows.append({"model": getattr(factory, "model_name", name),
                     "stock samples/s": median(rates["stock"]),
                     "stock range": spread(rates["stock"]),
                     "sped up samples/s": median(rates["sped up"]),
                     "sped up range": spread(rates["sped up"]),
                     "ratio (paired median)": ratio, "ratio range": spread(ratios),
                     "applied": ", ".join(fast.applied.applied) or "none",
                     "precision": fast.applied.precision, "decision s": decide_s})
        goals.append((f"{name}: not slower with the CPU speedups (ratio {ratio:.2f}x >= "
                      f"{NOT_SLOWER}; the decision took {decide_s:.2f} s)", ratio >= NOT_SLOWER))
    return rows, goals


def hand_loop(factory, x, y) -> float:
    """The stock loop a person writes: fp32 eager, AdamW, mse, zero_grad/backward/step.
    Returns samples/s over the whole run (model building included, as for the Trainer)."""
    t0 = time.perf_counter()
    model = build(factory).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for k in range(len(x) // BATCH):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb).reshape(-1), yb)
        loss.backward()
        opt.step()
    return len(x) / (time.perf_counter() - t0)


def trainer_run(factory, x, y, speedups) -> float:
    """hn.Trainer with its defaults (live off, on the CPU); samples/s over the whole fit."""
    import hybridnb as hn

    t0 = time.perf_counter()
    tr = hn.Trainer(build(factory), device="cpu", live=False, batch_size=BATCH, epochs=1,
                    seed=0, speedups=speedups)
    with contextlib.redirect_stdout(io.StringIO()):
        tr.fit((x, y))
    trainer_run.message = getattr(getattr(tr, "applied_speedups", None), "message", None)
    return len(x) / (time.perf_counter() - t0)


def part2(steps: int, rounds: int) -> tuple[list[dict], list[tuple[str, bool | None]]]:
    factory = zoo()["eegnex"]
    x, y = batches(factory, steps)
    funcs = {"stock hand loop": lambda: hand_loop(factory, x, y),
             "hn.Trainer(speedups=True)": lambda: trainer_run(factory, x, y, True),
             "hn.Trainer() (auto)": lambda: trainer_run(factory, x, y, "auto")}
    try:
        rates = interleaved(funcs, repeats=rounds)
    except Exception as exc:  # noqa: BLE001 — the Trainer is being rewritten meanwhile
        text = f"{type(exc).__name__}: {str(exc)[:160]}"
        return ([{"variant": "hn.Trainer", "error": text}],
                [(f"EEGNeX: hn.Trainer >= {TRAINER_GOAL}x the stock loop (failed: {text})",
                  None)])
    rows, goals = [], []
    base = rates["stock hand loop"]
    for name, values in rates.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        rows.append({"variant": name, "samples/s (whole run)": median(values),
                     "range": spread(values), "vs loop (paired median)": median(ratios),
                     "ratio range": spread(ratios)})
    ratio = next(r["vs loop (paired median)"] for r in rows
                 if r["variant"] == "hn.Trainer() (auto)")
    goals.append((f"EEGNeX: hn.Trainer with its defaults >= {TRAINER_GOAL:g}x the stock "
                  f"hand-written loop, whole runs (measured {ratio:.2f}x)", ratio >= TRAINER_GOAL))
    return rows, goals


def main() -> None:
    quick = env.quick()
    load0 = os.getloadavg()[0]
    steps1, rounds1 = (1, 1) if quick else (2, 4)
    steps2, rounds2 = (2, 1) if quick else (6, 3)
    print(f"part 1: {steps1} steps x {rounds1} rounds per copy", flush=True)
    rows1, goals1 = part1(steps1, rounds1)
    print(markdown_table(rows1), flush=True)
    print(f"part 2: {steps2} steps x {rounds2} rounds per variant", flush=True)
    rows2, goals2 = part2(steps2, rounds2)
    print(markdown_table(rows2), flush=True)
    msg = getattr(trainer_run, "message", None)
    body = (
        f"torch threads {torch.get_num_threads()}, batch {BATCH}, fp32 unless the decision "
        f"picked bf16, random {'x'.join(map(str, zoo()['eegnex'].input_shape))} windows.\n\n"
        f"## Part 1: zoo models, stock vs apply_speedups(model, x, 'cpu') ({steps1} steps per "
        f"round, {rounds1} interleaved rounds after one untimed step)\n\n"
        + markdown_table(rows1)
        + f"\n## Part 2: EEGNeX, hn.Trainer defaults vs the stock hand-written loop ({steps2} "
        f"steps per run, whole runs, {rounds2} interleaved rounds)\n\n"
        "`hn.Trainer() (auto)` is the Trainer's default (the CPU's rules); "
        "`hn.Trainer(speedups=True)` tries every knob. "
        "Whole-run samples/s include building the model and the Trainer's set-up.\n\n"
        + markdown_table(rows2)
        + (f"\nThe Trainer said: {msg}\n" if msg else "")
        + f"\n{load_note(load0)}\n")
    if quick:
        print(body)
        return
    write_result("cpu-speedups", "CPU speedups: zoo models and the Trainer on the CPU", body,
                 goals1 + [(f"no zoo model slower (every ratio >= {NOT_SLOWER})",
                            all(ok for _, ok in goals1))] + goals2)


if __name__ == "__main__":
    main()
