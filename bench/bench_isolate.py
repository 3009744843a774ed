"""Isolated training's cost: the same small training steps in this process and in a supervised worker.

Both variants run the same loop on the same model (a small EEG-sized conv net, built in this
process before the fork, as a notebook cell would): forward, backward, AdamW, ``loss.item()``.
Per step the isolated worker (spawned, as the Trainer's) sends what the Trainer's sends through
``run_isolated``'s channel: a "step_done" and the step's ``StepEnded`` event; every
SNAPSHOT_EVERY steps the model and optimizer state. In this process the same step keeps the
event, and the
snapshot is a clone (what in-process recovery keeps). Variants run interleaved (in-process,
isolated, in-process, ...); ratios are medians over rounds of (isolated / in-process).

Reported: median step time each way; the worker's time inside the channel per step (the direct
cost of isolation to a step); the kernel's CPU time per step receiving (on another core); the
one-off start (call to first step, the fork included) and end (result back, worker reaped); and
the transfer of states of 1-50 MB; the time from ``fit()`` to the first step in process and
isolated (cold, and with a warm spare: where that time goes).
"""

from __future__ import annotations

import math
import os
import pickle
import re
import statistics
import time

import torch
from torch import nn

from bench.common import interleaved, load_note, markdown_table, median, spread, write_result
from hybridnb import env
from hybridnb.events import StepRow
from hybridnb.train.bus import StepEnded
from hybridnb.train.heartbeat import EVENT
from hybridnb.train.isolate import run_isolated

BATCH, CHANS, TIMES = 64, 129, 200
STEPS, ROUNDS, SNAPSHOT_EVERY = 150, 5, 50


def make_model() -> nn.Module:
    """~20k parameters, a ~10-50 ms step on one CPU thread: the size of the EEG nets here."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(CHANS, 16, 9), nn.BatchNorm1d(16), nn.ELU(),
                         nn.AvgPool1d(8), nn.Flatten(), nn.Linear(16 * ((TIMES - 8) // 8), 1))


def make_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(BATCH, CHANS, TIMES, generator=g), torch.randn(BATCH, 1, generator=g))
            for _ in range(n)]


def train(model, batches, report, snapshot) -> dict:
    """The loop both variants run; ``report(i, loss)`` per step, ``snapshot(state)`` sometimes.
    Returns per-step stamps and the time spent inside report/snapshot."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stamps, inside, inside_cpu = [time.perf_counter()], 0.0, 0.0
    cpu0 = time.process_time()  # all threads (the channel's flusher too)
    for i, (x, y) in enumerate(batches, 1):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        t0, c0 = time.perf_counter(), time.thread_time()
        report(i, value)
        if i % SNAPSHOT_EVERY == 0:
            snapshot({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": i})
        t1 = time.perf_counter()
        inside_cpu += time.thread_time() - c0
        inside += t1 - t0
        stamps.append(t1)
    return {"stamps": stamps, "inside": inside, "inside_cpu": inside_cpu,
            "loop_cpu": time.process_time() - cpu0}


def in_process(batches, out: dict) -> None:
    kept = []

    def report(i, loss):
        kept.append(StepEnded(i, 0, loss, 1e-3, StepRow(step=i, loss=loss, epoch=0, lr=1e-3)))

    def snapshot(state):
        kept.append({k: (v.detach().clone() if torch.is_tensor(v) else v)
                     for k, v in state["model"].items()})

    r = train(make_model(), batches, report, snapshot)
    out.update(r, kernel_cpu=None, start=None, end=None)


def isolated(batches, out: dict) -> None:
    model = make_model()  # defined in the kernel, sent to the spawned worker (as the Trainer)
    marks: dict[str, float] = {}
    steps = len(batches)

    def work(channel):
        torch.set_num_threads(1)  # as this process: the same loop on the same threads
        mine = make_batches(steps)  # the same batches, made there (not 1 GB through /dev/shm)

        def report(i, loss):
            channel.step_done()
            channel.send(EVENT, StepEnded(i, 0, loss, 1e-3, StepRow(
                step=i, loss=loss, epoch=0, lr=1e-3)))

        return train(model, mine, report, channel.state)

    def on_message(m):
        marks.setdefault("first", time.perf_counter())
        if m.kind == "done":
            marks["done"] = time.perf_counter()

    t0, c0 = time.perf_counter(), time.process_time()
    outcome = run_isolated(work, on_message=on_message, start="spawn")
    t1, c1 = time.perf_counter(), time.process_time()
    assert outcome.ok, outcome.reason
    r = outcome.result
    out.update(r, kernel_cpu=c1 - c0, start=marks["first"] - t0 - (r["stamps"][1] - r["stamps"][0]),
               end=t1 - marks["done"], state_kept=outcome.state is not None)


def plain_fork(batches, out: dict) -> None:
    """The control: the same loop in a bare forked child (no supervisor, no channel), to
    separate what running in a forked process costs from what the supervisor adds."""
    model = make_model()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 1
        try:
            os.write(w, pickle.dumps(train(model, batches, lambda i, loss: None,
                                           lambda state: None)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 20):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    out.update(pickle.loads(b"".join(chunks)), kernel_cpu=None, start=None, end=None)


def measure(rounds: int, steps: int) -> tuple[list[dict], dict]:
    batches = make_batches(steps)
    per: dict[str, list[dict]] = {"in-process": [], "plain fork": [], "isolated": []}

    def variant(name, fn):
        def go():
            out: dict = {}
            fn(batches, out)
            per[name].append(out)
        return go

    funcs = {name: variant(name, fn) for name, fn in
             (("in-process", in_process), ("plain fork", plain_fork),
              ("isolated", isolated))}
    interleaved(funcs, repeats=1)  # warm-up round, dropped
    for runs in per.values():
        runs.clear()
    walls = interleaved(funcs, repeats=rounds)

    def step_s(run):
        s = run["stamps"]
        return statistics.median(b - a for a, b in zip(s[1:-1], s[2:], strict=True))

    steps_s = {n: [step_s(r) for r in per[n]] for n in per}

    def paired(values, name, base="in-process"):
        return median([a / b for a, b in zip(values[name], values[base], strict=True)])

    ratio = paired(steps_s, "isolated")
    vs_fork = paired(steps_s, "isolated", "plain fork")
    wall_ratio = paired(walls, "isolated")
    rows = []
    for name in per:
        runs = per[name]
        iso = name == "isolated"
        rows.append({
            "variant": name, "step ms": 1e3 * median(steps_s[name]),
            "step range ms": spread([1e3 * s for s in steps_s[name]]),
            "step / in-process": paired(steps_s, name),
            "step / plain fork": paired(steps_s, name, "plain fork"),
            "run wall s": median(walls[name]), "wall / in-process": paired(walls, name),
            "hand-over per step µs (wall)": 1e6 * median([r["inside"] / steps for r in runs]),
            "hand-over per step µs (CPU)": 1e6 * median([r["inside_cpu"] / steps
                                                         for r in runs]),
            "loop CPU per step ms": 1e3 * median([r["loop_cpu"] / steps for r in runs]),
            "kernel CPU per step µs": (1e6 * median([r["kernel_cpu"] / steps for r in runs])
                                       if iso else "-"),
            "start s": median([r["start"] for r in runs]) if iso else "-",
            "end s": median([r["end"] for r in runs]) if iso else "-"})
    inside_iso = median([r["inside_cpu"] / steps for r in per["isolated"]])
    inside_in = median([r["inside_cpu"] / steps for r in per["in-process"]])
    return rows, {"ratio": ratio, "vs_fork": vs_fork, "wall_ratio": wall_ratio, "step": median(steps_s["in-process"]),
                  "direct": (inside_iso - inside_in) / median(steps_s["in-process"]),
                  "start": median([r["start"] for r in per["isolated"]]),
                  "end": median([r["end"] for r in per["isolated"]])}


def first_step(model, data, isolate: bool) -> dict:
    """One ``Trainer.fit`` of 3 steps: seconds from ``fit()`` to the kernel hearing ``Started``
    and the first ``StepEnded``, and (isolated) the job handed over (``sent``), with the
    worker's own marks: the job received, the Loop built)."""
    from hybridnb.train import run_worker
    from hybridnb.train.bus import Started, StepEnded
    from hybridnb.train.trainer import Trainer

    tr = Trainer(model, device="cpu", isolate=isolate, batch_size=BATCH, epochs=1,
                 steps_per_epoch=3, schedule=None, speedups=False, live=False, verbose=False)
    marks: dict[str, float] = {}
    tr.bus.subscribe(lambda ev: isinstance(ev, (Started, StepEnded)) and marks.setdefault(
        type(ev).__name__, time.monotonic()))
    real = run_worker.run_job

    def run_job(trainer, job, **kw):
        marks["sent"] = time.monotonic()
        return real(trainer, job, **kw)

    run_worker.run_job = run_job
    t0 = time.monotonic()
    try:
        tr.fit(data)
    finally:
        run_worker.run_job = real
    assert not any(e.kind == "worker_lost" for e in tr.events)
    out = {k: v - t0 for k, v in marks.items()}
    said = [e.message for e in tr.events if e.kind == "worker_start"]
    if said:  # "... the fit waited 0.0 s for it"
        out["waited"] = float(re.findall(r"(\d+\.\d+) s", said[0])[-1])
    if isolate and os.path.exists(marks_path(os.getpid())):
        with open(marks_path(os.getpid())) as f:
            out.update({k: float(v) - t0 for k, v in (line.split() for line in f)})
        os.remove(marks_path(os.getpid()))
    return out


def marks_path(kernel_pid: int) -> str:
    return f"/tmp/hybridnb-bench-isolate-{kernel_pid}.marks"


def timed_work(job, channel):
    """In the worker: the job, with when it arrived and when its Loop was built written to the
    kernel's ``marks_path`` (monotonic clocks are one clock on this host)."""
    from hybridnb.train import worker_fit

    got, real = time.monotonic(), worker_fit.worker_loop

    def worker_loop(*args):
        loop = real(*args)
        with open(marks_path(os.getppid()), "w") as f:  # the kernel's
            f.write(f"received {got}\nbuilt {time.monotonic()}\n")
        return loop

    worker_fit.worker_loop = worker_loop
    return job.run(channel)


def first_steps(rounds: int) -> tuple[list[dict], list[dict]]:
    """Time from ``fit()`` to the first step: in this process; isolated with a worker started
    by ``fit`` (no spare); isolated again with a warm spare (ready before ``fit``). For the warm
    fit, where the time goes."""
    from hybridnb.processes import spare
    from hybridnb.train import worker_fit

    g = torch.Generator().manual_seed(0)
    data = (torch.randn(5 * BATCH, CHANS, TIMES, generator=g), torch.randn(5 * BATCH, 1,
                                                                            generator=g))
    runs: dict[str, list[dict]] = {"in-process": [], "isolated, cold": [],
                                   "isolated, warm spare": []}
    real_work, worker_fit.work = worker_fit.work, timed_work
    try:
        for _ in range(rounds + 1):  # the first round warms up and is dropped
            runs["in-process"].append(first_step(make_model(), data, False))
            spare.close_all()
            runs["isolated, cold"].append(first_step(make_model(), data, True))
            # the spare starts when a job ends: give it the cold start's time to import
            time.sleep(2 + 1.5 * runs["isolated, cold"][-1]["StepEnded"])
            runs["isolated, warm spare"].append(first_step(make_model(), data, True))
    finally:
        worker_fit.work = real_work
    rows = [{"variant": name, "fit() to first step s": median([r["StepEnded"] for r in v[1:]]),
             "range s": spread([r["StepEnded"] for r in v[1:]])} for name, v in runs.items()]
    warm = runs["isolated, warm spare"][1:]
    phases = [("kernel set-up: loaders, start state (fit() to the job handed over)", None, "sent"),
              ("the job to the worker: pickling, the pipe, unpickling", "sent", "received"),
              ("the worker builds the Loop (build_loop: parts, optimizer)", "received", "built"),
              ("the fit's set-up there to Started heard here (place, loaders, first state)",
               "built", "Started"),
              ("the first step, to its StepEnded heard here", "Started", "StepEnded")]
    where = [{"phase of the warm fit": name, "median s": median(
        [r[b] - (r[a] if a else 0.0) for r in warm if b in r and (a is None or a in r)])}
        for name, a, b in phases]
    where.append({"phase of the warm fit": "of which waiting for the worker to be ready",
                  "median s": median([r.get("waited", math.nan) for r in warm])})
    return rows, where


def payload_mb(obj) -> float:
    """What the kernel sends for ``obj``: its pickle and the shared-memory files beside it."""
    from hybridnb.processes.payload import discard, pack

    data, files = pack(obj)
    try:
        return (len(data) + sum(os.path.getsize(f) for f in files)) / 1e6
    finally:
        discard(files)


def braindecode_models(rounds: int) -> list[dict]:
    """An isolated fit of EEGNeX (parametrized max-norm layers: sent with their state) beside
    ShallowFBCSPNet's: from ``fit()`` to the first step's row, and the payload of the model."""
    import warnings

    warnings.simplefilter("ignore")
    from braindecode.models import EEGNeX, ShallowFBCSPNet

    builds = {"ShallowFBCSPNet": lambda: ShallowFBCSPNet(n_chans=CHANS, n_times=TIMES,
                                                         n_outputs=1),
              "EEGNeX": lambda: EEGNeX(n_chans=CHANS, n_times=TIMES, sfreq=100, n_outputs=1)}
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(5 * BATCH, CHANS, TIMES, generator=g), torch.randn(5 * BATCH, 1,
                                                                            generator=g))
    times: dict[str, list[float]] = {name: [] for name in builds}

    def fit(name: str) -> None:
        torch.manual_seed(0)
        times[name].append(first_step(builds[name](), data, True)["StepEnded"])

    interleaved({name: (lambda name=name: fit(name)) for name in builds}, repeats=rounds)
    rows = []
    for name, build in builds.items():
        model = build()
        rows.append({"model": name, "parameters": sum(p.numel() for p in model.parameters()),
                     "parametrized modules": sum(
                         torch.nn.utils.parametrize.is_parametrized(m) for m in model.modules()),
                     "model payload MB": payload_mb(model),
                     "fit() to first step s": median(times[name]),
                     "range s": spread(times[name])})
    return rows


def transfer(sizes_mb: tuple[int, ...], repeats: int = 5) -> list[dict]:
    """A state of n MB (float32 tensors of 1 MiB... 4 MiB) sent by the worker to the kernel."""
    rows = []
    for mb in sizes_mb:
        n = max(1, round(mb * 1e6 / 4 / 2**20))
        g = torch.Generator().manual_seed(0)
        state = {f"t{i}": torch.randn(2**20, generator=g) for i in range(n)}
        sent, got, blocked = [], [], []

        def work(channel, state=state):
            for _ in range(repeats):
                t0 = time.perf_counter()
                channel.send("stamp", t0)
                channel.state(state)
                channel.send("blocked", time.perf_counter() - t0)
                time.sleep(0.05)

        def on(m, sent=sent, got=got, blocked=blocked):
            if m.kind == "stamp":
                sent.append(time.perf_counter())
            elif m.kind == "state":
                got.append(time.perf_counter() - sent[-1])
            elif m.kind == "blocked":
                blocked.append(m.payload)

        outcome = run_isolated(work, on_message=on)
        assert outcome.ok and torch.equal(outcome.state["t0"], state["t0"]), outcome.reason
        size = sum(t.nbytes for t in state.values()) / 1e6
        rows.append({"state MB": size, "send to delivery ms": 1e3 * median(got),
                     "worker blocked ms": 1e3 * median(blocked),
                     "MB/s": size / median(got)})
    return rows


def main() -> None:
    torch.set_num_threads(1)  # as bench_trainer: one thread; the kernel's receiving has a core
    load0 = os.getloadavg()[0]
    quick = env.quick()
    rounds, steps = (1, 20) if quick else (ROUNDS, STEPS)
    rows, res = measure(rounds, steps)
    xfer = transfer((1, 10, 50), repeats=2 if quick else 5)
    first_rows, where = first_steps(1 if quick else 3)
    model_rows = braindecode_models(1 if quick else 3)
    body = (
        f"Model: Conv1d({CHANS}->16, 9) + BatchNorm + ELU + pool + Linear (~20k parameters), "
        f"input {CHANS}x{TIMES}, batch {BATCH}, fp32, CPU, 1 torch thread, AdamW, loss.item() "
        f"per step; {steps} steps per run, a snapshot every {SNAPSHOT_EVERY}; {rounds} "
        "interleaved rounds after one warm-up round.\n\n"
        "'step' is the median time between consecutive steps (2..N) inside the loop; "
        "'hand-over per step' is the time the loop spent handing its view update and "
        "snapshots over (in the worker: channel sends, batched and written about every 0.1 s; "
        "in-process: a list append and a clone), as wall time and as the thread's CPU time "
        "(on a loaded host a write that wakes the kernel can cost the worker its core for "
        "milliseconds: wall time shows that, CPU time does not); 'loop CPU per step' is the "
        "training process's CPU time over the loop (all its threads) per step; "
        "'kernel CPU per step' is the supervising process's CPU time per step (receiving, "
        "decoding, on_message); 'start' is the call to the first message minus the first step "
        "(spawn: a fresh interpreter importing torch), 'end' the \"done\" message to return "
        "(worker reaped). The isolated worker is spawned, as the Trainer's is, and runs on one "
        "torch thread like this process; 'plain fork' is the control without a supervisor.\n\n"
        + markdown_table(rows)
        + f"\nDirect cost of isolation to a step: (worker's CPU time in the channel - "
        f"in-process hand-over CPU time) / in-process step = {res['direct']:.3%}; measured "
        f"step ratio {res['ratio']:.4f}x (vs the plain forked child: {res['vs_fork']:.4f}x), "
        f"run wall ratio {res['wall_ratio']:.4f}x (start and end included). 'plain fork' is the "
        "same loop in a bare forked child: what it costs over in-process is the price of a "
        "forked process on this host (its CPU time per step), not of the supervisor.\n\n"
        "## Time to the first step: the Trainer in this process vs isolated\n\n"
        f"`Trainer(device='cpu', isolate=False|True, speedups=False)`, the model above, "
        f"batch {BATCH}, 3 steps; from `fit()` to the kernel hearing the first `StepEnded`. "
        "'cold': no spare, the worker is spawned when `fit` starts and imports torch while "
        "the kernel sets up; 'warm spare': the spare started when the previous job ended has "
        "imported torch before `fit` (the second isolated fit in a kernel).\n\n"
        + markdown_table(first_rows)
        + "\nWhere the warm fit's time goes (monotonic clock marks in the kernel and, through "
        "a job wrapper of this bench, in the worker):\n\n" + markdown_table(where) + "\n"
        "## braindecode models isolated: EEGNeX beside ShallowFBCSPNet\n\n"
        f"`Trainer(device='cpu', isolate=True, speedups=False)`, batch {BATCH} of "
        f"{CHANS}x{TIMES}, 3 steps; from `fit()` to the first step's row (the worker imports "
        "torch and then braindecode, which the model's classes need); interleaved rounds. "
        "EEGNeX's max-norm layers are torch parametrizations, which torch refuses to pickle: "
        "they travel with their state as it is (processes/parametrized.py). The payload is "
        "the model's pickle plus its shared-memory files (tensors of 1 MB or more).\n\n"
        + markdown_table(model_rows) + "\n"
        "## Sending the last good state to the kernel\n\n"
        "Raw tensor frames on a 1 MiB pipe (processes/channel.py); for comparison on this host, "
        "pickling the same 50 MB took 455 ms to deliver (341 ms blocking the worker) and "
        "torch.save to a /dev/shm file + torch.load 158 ms (120 ms).\n\n"
        + markdown_table(xfer) + "\n" + load_note(load0) + "\n")
    if quick:
        print(body)
        return
    busy = os.getloadavg()[0] > 0.75 * len(os.sched_getaffinity(0))
    write_result("isolate", "Isolated training: supervised worker vs in-process", body, [
        (f"isolation's direct CPU cost <= 2% of a {1e3 * res['step']:.0f} ms step (measured "
         f"{res['direct']:.3%})", res["direct"] <= 0.02),
        (f"measured step time isolated / in-process <= 1.02 (measured {res['ratio']:.4f}x; "
         f"isolated / plain fork {res['vs_fork']:.4f}x"
         + ("; the host was busy, see the load note" if busy else "") + ")",
         res["ratio"] <= 1.02)])


if __name__ == "__main__":
    main()
