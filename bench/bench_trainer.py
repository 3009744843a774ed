"""Trainer vs a hand-written PyTorch loop, same model and data, live view on.

Random (129 channels x 200 samples) windows, batch 64, fp32 on the CPU, AdamW + warmup-cosine +
clipping + loss logging in both. Variants run interleaved (loop, trainer+text, trainer+html,
trainer+widgets, loop, ...); ratios are medians over rounds of (variant / loop in that round).

Part 1 trains braindecode's ShallowFBCSPNet. On this shared 2-core host identical runs differ by
tens of percent, which hides a 2% effect, so part 2 trains a near-free model (Flatten + Linear)
on the same data for many steps: there the Trainer's own cost per step is what differs, and it is
projected onto part 1's step time.

The html and widgets renderers run headless here: their display handles are captured instead of
sent to a frontend (for widgets, no comm messages go out, so that cost is a lower bound).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.common import interleaved, markdown_table, median, spread, write_result
from hybridnb import env

BATCH, CHANS, TIMES = 64, 129, 200
EPOCHS, STEPS_PER_EPOCH, ROUNDS = 2, 5, 6
LR = 1e-3


def make_model(kind: str = "shallow") -> nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(CHANS * TIMES, 1))
    from braindecode.models import ShallowFBCSPNet

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShallowFBCSPNet(n_chans=CHANS, n_outputs=1, n_times=TIMES,
                               final_conv_length="auto")


def make_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = BATCH * steps
    return torch.randn(n, CHANS, TIMES, generator=g), torch.randn(n, generator=g)


def hand_loop(x, y, stamps: list[float], kind: str, epochs: int) -> None:
    """What a person writes by hand: the same optimizer, schedule, clipping and loss logging."""
    model = make_model(kind)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    total = epochs * len(loader)
    warm = max(1, round(0.05 * total))
    step, losses = 0, []
    model.train()
    stamps.append(time.perf_counter())
    for _ in range(epochs):
        for xb, yb in loader:
            f = (step + 1) / warm if step < warm else 0.5 * (
                1 + math.cos(math.pi * (step - warm) / max(total - warm, 1)))
            for group in opt.param_groups:
                group["lr"] = LR * f
            loss = nn.functional.mse_loss(model(xb), yb.reshape(-1, 1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step += 1
            stamps.append(time.perf_counter())


class _Handle:
    """A display handle that keeps the last bundle (headless html / widgets renderers)."""

    def __init__(self, obj):
        self.obj = obj

    def update(self, obj, **kwargs):
        self.obj = obj


class TimedView:
    """Wraps a live view: times each call (``spent[name]``) and stamps every per-step update."""

    def __init__(self, view, stamps: list[float], spent: dict[str, float]):
        self._view, self._stamps, self._spent = view, stamps, spent

    @property
    def stop_requested(self) -> bool:
        return self._view.stop_requested

    def _timed(self, name, arg):
        t0 = time.perf_counter()
        getattr(self._view, name)(arg)
        self._spent[name] = self._spent.get(name, 0.0) + time.perf_counter() - t0
        return t0

    def start(self, run):
        self._stamps.append(self._timed("start", run))

    def update(self, state):
        t0 = self._timed("update", state)
        if not state.get("epoch_end"):
            self._stamps.append(t0)

    def event(self, ev):
        self._timed("event", ev)

    def end(self, summary):
        self._timed("end", summary)


def renderer(kind: str):
    from hybridnb.live import make_view

    if kind == "text":
        return make_view("text")
    if kind == "html":
        from hybridnb.live.html import HtmlView

        return HtmlView(display=_Handle)
    from hybridnb.live.widgets import WidgetView

    return WidgetView(display=_Handle)


def warm_up(kind: str) -> None:
    """One tiny start/update/end cycle of a renderer (its imports happen here)."""
    import pandas as pd

    view = renderer(kind)
    view.start({"epochs": 1, "steps_per_epoch": 1, "batch_size": BATCH, "device": "cpu",
                "precision": "fp32", "model": "warm-up", "n_params": 1, "monitor": "val_loss",
                "quick": False})
    view.update({"epoch": 0, "step": 1, "global_step": 1, "loss": 1.0, "lr": LR,
                 "samples_per_s": 1.0, "elapsed_s": 0.1})
    view.update({"epoch": 0, "step": 1, "global_step": 1, "loss": 1.0, "lr": LR,
                 "samples_per_s": 1.0, "elapsed_s": 0.1, "epoch_end": True})
    view.end({"history": pd.DataFrame({"epoch": [0], "train_loss": [1.0]}), "best": {},
              "elapsed_s": 0.1, "samples_per_s": 1.0, "peak_memory_bytes": None, "events": [],
              "device": "cpu", "precision": "fp32", "stopped": None})


def trainer_run(x, y, kind: str, stamps: list[float], spent: dict[str, float], model: str,
                epochs: int, isolate: bool = False) -> None:
    """The Trainer; ``isolate``: its steps in a supervised worker process, drawn by this one."""
    import hybridnb.train.opening as opening_mod
    import hybridnb.train.trainer as trainer_mod

    real = opening_mod.make_view  # the kernel's view, also for an isolated (spawned) worker
    opening_mod.make_view = lambda live: TimedView(renderer(kind), stamps, spent)
    try:
        tr = trainer_mod.Trainer(make_model(model), device="cpu", precision="fp32",
                                 batch_size=BATCH, epochs=epochs, lr=LR, live=kind, seed=0,
                                 schedule="warmup_cosine", clip_grad=1.0, isolate=isolate)
        tr.fit((x, y))
    finally:
        opening_mod.make_view = real


def measure(model: str, epochs: int, steps: int, rounds: int) -> tuple[list[dict], dict]:
    """Interleaved runs of the four variants; returns table rows and medians per variant."""
    x, y = make_data(steps)
    per: dict[str, dict[str, list]] = {}

    def variant(name, fn):
        per[name] = {"step": [], "share": [], "once": [], "cpu": [], "mean_step": []}

        def go():
            stamps, spent = [], {}
            quiet = name != "trainer+text" or model != "shallow"
            t0, c0 = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
                fn(stamps, spent)
            wall = time.perf_counter() - t0
            per[name]["cpu"].append(time.process_time() - c0)
            diffs = [b - a for a, b in zip(stamps[1:-1], stamps[2:], strict=True)]  # steps 2..N
            per[name]["step"].append(median(diffs))
            # steps 2..N on average: an isolated run's updates arrive in batches, so only the
            # span is meaningful for it (used for every variant when comparing with isolation)
            per[name]["mean_step"].append((stamps[-1] - stamps[1]) / max(len(stamps) - 2, 1))
            span = stamps[-1] - stamps[0]
            per[name]["share"].append((spent.get("update", 0.0) + spent.get("event", 0.0)) / span)
            per[name]["once"].append(spent.get("start", 0.0) + spent.get("end", 0.0))
            return wall
        return go

    funcs = {"loop": variant("loop", lambda st, sp: hand_loop(x, y, st, model, epochs))}
    for kind in ("text", "html", "widgets"):
        funcs[f"trainer+{kind}"] = variant(
            f"trainer+{kind}",
            lambda st, sp, kind=kind: trainer_run(x, y, kind, st, sp, model, epochs))
    funcs["trainer+text+isolated"] = variant(
        "trainer+text+isolated",
        lambda st, sp: trainer_run(x, y, "text", st, sp, model, epochs, isolate=True))
    interleaved(funcs, repeats=1)  # warm-up round (fresh memory pages, kernel choices), dropped
    for name in per:
        per[name] = {k: [] for k in per[name]}
    walls = interleaved(funcs, repeats=rounds)

    def paired(name: str, values: dict[str, list[float]]) -> float:
        return median([a / b for a, b in zip(values[name], values["loop"], strict=True)])

    cpus = {n: per[n]["cpu"] for n in funcs}
    steps_s = {n: per[n]["step"] for n in funcs}
    rows, out = [], {}
    for name, ws in walls.items():
        loop = name == "loop"
        row = {"variant": name, "run wall s": median(ws), "wall range": spread(ws),
               "wall / loop": paired(name, walls), "run CPU s": median(cpus[name]),
               "CPU / loop": paired(name, cpus), "step ms": 1e3 * median(steps_s[name]),
               "step / loop": paired(name, steps_s),
               "view update share": "-" if loop else f"{median(per[name]['share']):.3%}",
               "view start+end s": "-" if loop else median(per[name]["once"])}
        rows.append(row)
        out[name] = {"wall": paired(name, walls), "cpu": paired(name, cpus),
                     "step_s": median(steps_s[name]), "step": paired(name, steps_s),
                     "share": 0.0 if loop else median(per[name]["share"]),
                     "mean_step": per[name]["mean_step"]}
    return rows, out


def first_steps(pauses: tuple[float, ...] = (0.0, 8.0, 0.0)) -> list[dict]:
    """Seconds from ``fit()`` to its first step's row in this process: one in-process fit for
    reference, then isolated fits in a row, the first with a cold worker, the later ones on the
    warm spare worker, each after ``pauses[i]`` seconds (a person running the next cell). The
    isolated worker's rows arrive in batches (at most 0.1 s apart), so these are upper bounds."""
    import hybridnb.train.opening as opening_mod
    import hybridnb.train.trainer as trainer_mod
    from hybridnb.processes import spare

    spare.close_all()  # the parts before left a spare: fit 1 starts a worker of its own
    x, y = make_data(4)
    rows = []
    real = opening_mod.make_view
    try:
        for i, pause in enumerate((0.0, *pauses)):
            time.sleep(pause)
            stamps: list[float] = []
            opening_mod.make_view = lambda live, st=stamps: TimedView(renderer("text"), st, {})
            tr = trainer_mod.Trainer(make_model("linear"), device="cpu", precision="fp32",
                                     batch_size=BATCH, epochs=1, lr=LR, live="text", seed=0,
                                     isolate=i > 0)
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                tr.fit((x, y))
            rows.append({"fit": "in process" if i == 0 else f"isolated, fit {i}"
                         + (" (cold worker)" if i == 1 else " (warm spare)"),
                         "pause before s": pause,
                         "fit() to first step s": stamps[1] - t0 if len(stamps) > 1 else None,
                         "whole fit s": time.perf_counter() - t0})
    finally:
        opening_mod.make_view = real
    return rows


def main() -> None:
    torch.set_num_threads(1)  # faster than 2 on this busy 2-core host (see feasibility notes)
    quick = env.quick()
    plan = {"shallow": (EPOCHS, 2 if quick else STEPS_PER_EPOCH, 1 if quick else ROUNDS),
            "linear": (10, 5 if quick else 20, 1 if quick else 5)}
    x, y = make_data(1)
    warm = make_model()  # import braindecode and warm the kernels up, outside the timings
    nn.functional.mse_loss(warm(x[:BATCH]), y[:BATCH, None]).backward()
    with contextlib.redirect_stdout(io.StringIO()):
        for kind in ("text", "html", "widgets"):  # import plotly & co. once, outside the timings
            warm_up(kind)
    # no warm spare in parts 1 and 2: its start-up after each isolated run would take CPU from
    # the next variant's run (part 3 measures the spare itself)
    warm_setting = os.environ.get("HYBRIDNB_WARM_WORKER")
    os.environ["HYBRIDNB_WARM_WORKER"] = "0"
    shallow_rows, shallow = measure("shallow", *plan["shallow"])
    linear_rows, linear = measure("linear", *plan["linear"])
    if warm_setting is None:
        os.environ.pop("HYBRIDNB_WARM_WORKER")
    else:
        os.environ["HYBRIDNB_WARM_WORKER"] = warm_setting

    shallow_step = shallow["loop"]["step_s"]
    loop_step = linear["loop"]["step_s"]
    proj_rows, goals = [], []
    for name in ("trainer+text", "trainer+html", "trainer+widgets"):
        extra = linear[name]["step_s"] - loop_step  # the Trainer's own cost per step, seconds
        proj = (shallow_step + extra) / shallow_step
        view_s = linear[name]["share"] * linear[name]["step_s"]
        proj_rows.append({"variant": name, "extra per step ms (part 2)": 1e3 * extra,
                          "of which live view ms": 1e3 * view_s,
                          "projected step / loop (ShallowFBCSPNet)": proj,
                          "live view share of a ShallowFBCSPNet step":
                              f"{view_s / shallow_step:.3%}",
                          "measured step / loop (part 1)": shallow[name]["step"]})
        goals.append((f"{name}: Trainer <= 1.02x the hand-written loop per ShallowFBCSPNet step "
                      f"(projected {proj:.4f}x from part 2; part 1 measured step "
                      f"{shallow[name]['step']:.3f}x, wall "
                      f"{shallow[name]['wall']:.3f}x, CPU {shallow[name]['cpu']:.3f}x)",
                      proj <= 1.02))
        goals.append((f"{name}: live view <= 1% of step time (part 1 measured "
                      f"{shallow[name]['share']:.3%}; part 2 projected "
                      f"{view_s / shallow_step:.3%})",
                      shallow[name]["share"] <= 0.01 and view_s / shallow_step <= 0.01))
    iso_rows = []
    for part, res in (("part 1 (ShallowFBCSPNet)", shallow), ("part 2 (Flatten + Linear)", linear)):
        ratio = median([a / b for a, b in zip(res["trainer+text+isolated"]["mean_step"],
                                              res["trainer+text"]["mean_step"], strict=True)])
        extra_ms = 1e3 * (median(res["trainer+text+isolated"]["mean_step"])
                          - median(res["trainer+text"]["mean_step"]))
        iso_rows.append({"part": part, "mean step, in-process ms":
                         1e3 * median(res["trainer+text"]["mean_step"]),
                         "mean step, isolated ms":
                         1e3 * median(res["trainer+text+isolated"]["mean_step"]),
                         "isolated / in-process": ratio, "extra per step ms": extra_ms})
    iso_ratio = iso_rows[0]["isolated / in-process"]
    iso_proj = (shallow_step + iso_rows[1]["extra per step ms"] / 1e3) / shallow_step
    goals.append((f"isolation costs <= 2% of a ShallowFBCSPNet step (measured "
                  f"{iso_ratio:.3f}x; projected from part 2 {iso_proj:.4f}x)",
                  min(iso_ratio, iso_proj) <= 1.02))
    first_rows = first_steps()
    second = first_rows[2]["fit() to first step s"] or float("inf")
    back = first_rows[3]["fit() to first step s"] or float("inf")
    goals.append((f"the second isolated fit in a process, started {first_rows[2]['pause before s']:.0f} s after "
                  f"the first ended, reaches its first step within 0.5 s of fit() on the CPU "
                  f"(measured {second:.2f} s; a fit started right after the previous one "
                  f"waits for its spare's imports: {back:.2f} s)", second <= 0.5))
    e1, n1, r1 = plan["shallow"]
    e2, n2, r2 = plan["linear"]
    body = (
        f"Input {CHANS}x{TIMES}, batch {BATCH}, fp32, CPU, 1 torch thread, AdamW + "
        "warmup-cosine + clip 1.0 + loss.item() per step in both; the Trainer also runs its loss "
        "guard, history, snapshots of the last good state and the live view. html and widgets "
        "renderers run headless (display handles captured; no widget comm messages).\n\n"
        f"## Part 1: ShallowFBCSPNet (braindecode), {e1} epochs x {n1} steps per run, {r1} "
        f"interleaved rounds after one warm-up round ({5 * (r1 + 1) * e1 * n1} steps in all)\n\n"
        "'run wall' includes building the model, optimizer and loader (and the Trainer's set-up "
        "and end); 'step' is the median time between consecutive steps (steps 2..N); 'run CPU' "
        "is the process's CPU time. View update share = time inside view.update/event over the "
        "time from the first to the last step; view start+end = the one-off cost of opening the "
        "view and drawing its final summary.\n\n"
        + markdown_table(shallow_rows)
        + f"\n## Part 2: near-free model (Flatten + Linear) on the same data, {e2} epochs x {n2} "
        f"steps per run, {r2} interleaved rounds after one warm-up round ({5 * (r2 + 1) * e2 * n2} steps in all)\n\n"
        + markdown_table(linear_rows)
        + "\n## The Trainer's own cost, projected onto a ShallowFBCSPNet step\n\n"
        f"extra per step = Trainer step - loop step in part 2; projected = (ShallowFBCSPNet loop "
        f"step {1e3 * shallow_step:.0f} ms + extra) / loop step.\n\n"
        + markdown_table(proj_rows)
        + "\n## Isolation: the same Trainer with its steps in a supervised worker process\n\n"
        "isolate=True starts a worker process (spawned) that trains and sends its view updates, states and step "
        "completions to this process, which draws them. Updates arrive in batches, so steps are "
        "compared by their mean (span of steps 2..N / steps) for both variants, paired per "
        "round; the run's fork and hand-over are in 'run wall' above.\n\n"
        + markdown_table(iso_rows)
        + "\n## Time to the first step: a fresh worker, then the warm spare\n\n"
        "Seconds from `fit()` to the first step's row in this process (near-free model, "
        "in-memory data). When an isolated fit's job is over, a spare worker starts and imports "
        "torch (not earlier: on 2 cores it would slow the fit); the next fit takes it. Fit 2 "
        "comes after a pause, as the next fit in a notebook comes a few cells later; fit 3 "
        "comes right after fit 2 and waits for the rest of its spare's import.\n\n"
        + markdown_table(first_rows))
    if quick:
        print(body)
        return
    write_result("trainer", "Trainer vs hand-written loop (live view on)", body, goals)


if __name__ == "__main__":
    main()
