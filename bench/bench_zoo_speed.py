"""Braindecode's model zoo on the CPU: a stock training step against the step with the speedups
the Trainer's defaults apply, paired in one run, with exactness.

Every model of ``braindecode.models`` is built for the challenge's input (``n_chans=129,
n_times=200, sfreq=100, n_outputs=1``); one that does not build (or whose forward + backward
fails) is listed with its reason. The challenges' recipes (``data_prep.recipes`` C1 and C2:
ShallowFBCSPNet with their arguments) are measured as two more rows.

What is timed, and why it is the whole training step: two copies of each model (same seed),
stock and after ``apply_speedups(model, x, "cpu")`` — the very call (mode "auto", precision
"auto") the Trainer's placement makes with its defaults on the first batch — each trained in a
hand loop of whole steps: forward, MSE loss, backward, ``AdamW.step``, ``zero_grad``, batch
``BATCH`` of random 129 x 200 windows. The Trainer's run adds per-step work that is the same
for both (EMA, the loss's running mean) and a set-up (the decision itself, printed per model);
timing the two copies in one loop isolates what the speedups change, and nothing of the step
is left out. ``bench/bench_cpu_speedups.py`` part 2 times ``hn.Trainer`` end to end for EEGNeX.
One untimed step each first (oneDNN primitives), then interleaved rounds (stock, sped up, stock,
...), each round ``n`` steps (about ``ROUND_S`` s), the ratio paired per round, medians. A model
the decision leaves unchanged runs the very same step on both sides: it is listed with ratio 1
and not timed (``--time-unchanged`` times it anyway, an A/A check of the host's noise).

Exactness (before any timed step, on copies): one training-mode forward + backward of each copy
on the same batch and seed, with the dropout modules in eval mode (channels_last, which the CPU
rules apply to grouped convolutions, makes dropout draw other, equally likely masks for the same
seed; the arithmetic is what is compared): the largest absolute difference of the outputs and of
every gradient, and relative to the largest stock value.

    .venv/bin/python -m bench.bench_zoo_speed                    # ~20-40 min on 2 cores
    .venv/bin/python -m bench.bench_zoo_speed --models ShallowFBCSPNet,EEGNeX,C1,C2
    HYBRIDNB_QUICK=1 .venv/bin/python -m bench.bench_zoo_speed   # a few models, prints only
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import io
import os
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from bench.common import load_note, markdown_table, median, spread, write_result
from hybridnb import env

N_CHANS, N_TIMES, SFREQ = 129, 200, 100
BATCH = 64  # the recipes' batch
NOT_SLOWER = 0.97
RECIPE_GOAL, EEGNEX_GOAL = 3.0, 2.2
ROUND_S = 0.6  # seconds of steps per copy and round
ROUNDS = 5
SLOW_STEP_S = 3.0  # a stock step slower than this: 3 rounds of one step (2 beyond 6x this)
QUICK_MODELS = ("ShallowFBCSPNet", "EEGNeX", "C1")
FIRST = ("C1", "C2", "EEGNeX", "ShallowFBCSPNet", "Deep4Net")  # measured first: the goals


def zoo_names() -> list[str]:
    """Every model class braindecode.models exports (EEGModuleMixin subclasses)."""
    from braindecode import models
    from braindecode.models.base import EEGModuleMixin

    return [n for n in models.__all__
            if inspect.isclass(cls := getattr(models, n, None)) and issubclass(cls, nn.Module)
            and issubclass(cls, EEGModuleMixin)]


def builder(name: str) -> Callable[[], nn.Module]:
    """A function building model ``name`` (a braindecode class, or "C1"/"C2" for the recipes)."""
    if name in ("C1", "C2"):
        from data_prep.recipes import RECIPES

        recipe = RECIPES[int(name[1])]
        return lambda: recipe.build(0)
    from braindecode import models

    from bench.zoo import NOT_BUILT

    if name in NOT_BUILT:  # building it reaches the network
        raise ValueError(f"not built here: {NOT_BUILT[name]}")
    cls = getattr(models, name)
    return lambda: cls(n_chans=N_CHANS, n_times=N_TIMES, sfreq=SFREQ, n_outputs=1)


def build(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().train()


def first_output(out) -> torch.Tensor:
    while isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, dict):
        out = next(iter(out.values()))
    return out


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
            autocast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = first_output(model(x))
    out = out.float().reshape(len(x), -1).mean(1)
    return nn.functional.mse_loss(out, y), out


class Copy:
    """One model copy with its AdamW; ``run(n)`` trains ``n`` whole steps, returns seconds."""

    def __init__(self, model: nn.Module, x, y, applied=None) -> None:
        self.model, self.x, self.y, self.applied = model, x, y, applied
        self.bf16 = applied is not None and applied.precision == "bf16"
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(self) -> None:
        loss, _ = loss_of(self.model, self.x, self.y, self.bf16)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        return time.perf_counter() - t0


def dropout_off(model: nn.Module) -> None:
    for m in model.modules():
        if "dropout" in type(m).__name__.lower() or "droppath" in type(m).__name__.lower():
            m.eval()


def exactness(stock: nn.Module, fast: nn.Module, x, y, bf16: bool) -> dict:
    """One training-mode forward + backward of copies of both (dropout off, same seed): max
    |difference| of outputs and gradients, absolute and relative to the stock maximum."""
    a, b = copy.deepcopy(stock), copy.deepcopy(fast)
    grads, outs = [], []
    for model, low in ((a, False), (b, bf16)):
        model.train()
        dropout_off(model)
        torch.manual_seed(1)
        loss, out = loss_of(model, x, y, low)
        loss.backward()
        outs.append(out.detach())
        grads.append([p.grad for p in model.parameters()])
    out_abs = (outs[0] - outs[1]).abs().max().item()
    out_ref = outs[0].abs().max().item()
    g_abs, g_ref = 0.0, 0.0
    for ga, gb in zip(*grads, strict=True):
        if ga is None or gb is None:
            continue
        g_abs = max(g_abs, (ga - gb).abs().max().item())
        g_ref = max(g_ref, ga.abs().max().item())
    return {"out max abs diff": out_abs, "out rel": out_abs / max(out_ref, 1e-12),
            "grad max abs diff": g_abs, "grad rel": g_abs / max(g_ref, 1e-12)}


def measure(name: str, quick: bool, time_unchanged: bool = False) -> dict:
    from hybridnb.speedups import apply_speedups

    make = builder(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, N_CHANS, N_TIMES, generator=g)
    y = torch.randn(BATCH, generator=g)
    stock = build(make)
    fast = build(make)
    applied = apply_speedups(fast, x, "cpu")
    row = {"model": name, "params": sum(p.numel() for p in stock.parameters()),
           "applied": ", ".join(applied.applied) or "none",
           "decision s": applied.seconds,
           "channels_last trial": (  # its paired median, or why it did not run
               f"{applied.speedup['channels_last']:.2f}x" if "channels_last" in applied.speedup
               else "not measured" if "not measured" in applied.skipped.get("channels_last", "")
               else "")}
    if not applied.applied and not time_unchanged:  # the very same model and step: ratio 1
        row.update({"out rel": 0.0, "grad rel": 0.0, "ratio (paired median)": 1.0,
                    "rounds x steps": "not timed: nothing applied"})
        return row
    row.update(exactness(stock, fast, x, y, applied.precision == "bf16"))
    a, b = Copy(stock, x, y), Copy(fast, x, y, applied)
    warm = a.run(1)
    b.run(1)
    if quick:
        n, rounds = 1, 2
    elif warm > SLOW_STEP_S:
        n, rounds = 1, 3 if warm < 6 * SLOW_STEP_S else 2
    else:
        n, rounds = max(1, round(ROUND_S / warm)), ROUNDS
    times = {"stock": [], "fast": []}
    for _ in range(rounds):
        times["stock"].append(a.run(n) / n)
        times["fast"].append(b.run(n) / n)
    ratios = [s / f for s, f in zip(times["stock"], times["fast"], strict=True)]
    row.update({"stock ms/step": 1e3 * median(times["stock"]),
                "sped up ms/step": 1e3 * median(times["fast"]),
                "ratio (paired median)": median(ratios), "ratio range": spread(ratios),
                "rounds x steps": f"{rounds}x{n}"})
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names (braindecode classes, C1, C2); "
                        "default: the whole zoo and both recipes")
    parser.add_argument("--time-unchanged", action="store_true",
                        help="also time models the decision leaves unchanged (the same step on "
                        "both sides: an A/A check of this host's noise)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own); one "
                        "thread keeps a shared, loaded host's paired ratios fair (no parallel "
                        "kernel waits on a descheduled partner)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = env.quick()
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    if args.models:
        names = args.models.split(",")
    elif quick:
        names = list(QUICK_MODELS)
    else:
        names = [*FIRST, *(n for n in zoo_names() if n not in FIRST)]
    rows, failed = [], []
    for done, name in enumerate(names):
        if rows and not quick:  # what is measured so far, in case the run is stopped
            partial(rows, failed, load0, t_start, args.models, done, len(names), args.threads)
        t0 = time.perf_counter()
        try:
            row = measure(name, quick, args.time_unchanged)
        except Exception as exc:  # noqa: BLE001 — a model that does not build is listed
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            failed.append({"model": name, "why not measured": why})
            print(f"  {name}: not measured ({why})", flush=True)
            continue
        rows.append(row)
        print(f"  {name}: {row['ratio (paired median)']:.2f}x ({row['applied']}; out rel "
              f"{row['out rel']:.1e}, grad rel {row['grad rel']:.1e}; "
              f"{time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f})", flush=True)
    body, goals = report(rows, failed, load0, time.perf_counter() - t_start, args.models,
                         args.threads)
    if quick:
        print(body)
        return
    write_result(result_name_for(args.models, args.threads), "Braindecode's zoo on the CPU: stock step vs the "
                 "Trainer's default speedups" + (f" ({args.models})" if args.models else ""),
                 body, goals)


def result_name(models: str | None) -> str:
    """``zoo-speed-cpu`` for the whole zoo; a run of chosen models keeps its own file."""
    return "zoo-speed-cpu-models" if models else "zoo-speed-cpu"


def result_name_for(models: str | None, threads: int | None) -> str:
    return result_name(models) + (f"-{threads}thread" if threads else "")


def partial(rows, failed, load0, t_start, models, done: int, total: int,
            threads: int | None = None) -> None:
    body, goals = report(rows, failed, load0, time.perf_counter() - t_start, models, threads)
    with contextlib.redirect_stdout(io.StringIO()):  # written, not printed
        write_result(result_name_for(models, threads), "Braindecode's zoo on the CPU: stock step vs the "
                     f"Trainer's default speedups (partial: {done} of {total} models so far)",
                     body, goals)


def report(rows: list[dict], failed: list[dict], load0: float, seconds: float,
           models: str | None, threads: int | None = None
           ) -> tuple[str, list[tuple[str, bool | None]]]:
    ratio = {r["model"]: r["ratio (paired median)"] for r in rows}
    ratios = sorted(ratio.values())
    worst_rel = max((max(r["out rel"], r["grad rel"]) for r in rows if "precision" not in
                     r["applied"]), default=0.0)
    cmd = "PYTHONPATH=. .venv/bin/python -m bench.bench_zoo_speed" + (
        f" --models {models}" if models else "") + (f" --threads {threads}" if threads else "")
    summary = ""
    if ratios:
        summary = (f"{len(rows)} models measured, {len(failed)} not; step ratio (stock time / "
                   f"sped-up time) min {ratios[0]:.2f}x, median {median(ratios):.2f}x, max "
                   f"{ratios[-1]:.2f}x. Worst fp32 difference relative to the stock maximum: "
                   f"{worst_rel:.1e} (outputs and gradients of the first step).\n\n")
    body = (f"Re-run: `{cmd}` ({seconds / 60:.0f} min here). torch threads "
            f"{torch.get_num_threads()}, batch {BATCH}, random {N_CHANS} x {N_TIMES} windows, "
            "AdamW + MSE, fp32 unless the decision picked bf16.\n\n"
            + (__doc__.split("\n\n")[2]) + "\n\n" + summary
            + markdown_table(rows)
            + ("\n## Not measured\n\n" + markdown_table(failed) if failed else "")
            + f"\n{load_note(load0)} `/proc/loadavg` at the end: {loadavg()}\n")
    goals: list[tuple[str, bool | None]] = []
    for name, goal in (("C1", RECIPE_GOAL), ("C2", RECIPE_GOAL), ("EEGNeX", EEGNEX_GOAL)):
        if name in ratio:
            goals.append((f"{name}: a whole training step >= {goal:g}x stock (measured "
                          f"{ratio[name]:.2f}x)", ratio[name] >= goal))
    slow = [f"{m} {v:.2f}x" for m, v in ratio.items() if v < NOT_SLOWER]
    goals.append((f"no model slower than {NOT_SLOWER}x stock"
                  + (f" (slower: {', '.join(slow)})" if slow else ""), not slow))
    goals.append((f"no rewrite changes a result beyond float rounding (worst relative "
                  f"difference {worst_rel:.1e} <= 1e-4)", worst_rel <= 1e-4))
    return body, goals


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    main(sys.argv[1:])
