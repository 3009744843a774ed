"""GPU speed for the challenge models: EEGNeX and ShallowFBCSPNet, batch 256, (129, 200) windows —
the stock fp32 hand loop, a hand loop with the best knobs (bf16 + channels_last + depthwise as
matmul + compile), hybridnb.Trainer defaults and Lightning's Trainer, each in a fresh process (wall
clock with start-up), and the native depthwise kernel's share of GPU time (torch.profiler). On the
CPU: the rewrite and channels_last against stock for EEGNeX, so we know they never slow a CPU.

    .venv/bin/python -m bench.bench_gpu                 # GPU section if CUDA, then the CPU one
    .venv/bin/python -m bench.bench_gpu --dry-run       # the GPU section's code paths on the CPU

Goals (issue 14), on an H100: EEGNeX through hn.Trainer defaults >= 9,000 samples/s, >= 5x the
stock fp32 loop; hybridnb's wall time (start-up included) <= 0.5x Lightning's; the native
depthwise kernel < 5% of GPU time with the knobs. On the CPU: apply_speedups' choice no slower
than stock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

MARK = "GPU_BENCH_RESULT "
LR = 1e-3
MODELS = ("eegnex", "shallow")
CONTENDERS = ("stock", "best", "hybridnb", "lightning")
LABEL = {"stock": "hand loop, fp32 eager (stock)",
         "best": "hand loop, bf16 + channels_last + rewrite + compile",
         "hybridnb": "hn.Trainer defaults", "lightning": "Lightning Trainer defaults"}
# per model on CUDA: optimizer steps per run (the first WARM are not in the steady rate)
STEPS = {"eegnex": 150, "shallow": 300}
WARM = 10
DEPTHWISE_KERNEL = "conv_depthwise2d"  # PyTorch's native (non-cuDNN) depthwise kernels


def build_model(name: str):
    warnings.filterwarnings("ignore", category=UserWarning)
    from hybridnb_tools.models import MODELS

    return MODELS[name]()


def windows(n: int, seed: int = 0):
    """n synthetic (129, 200) windows with a learnable target (N, 1), as CPU tensors."""
    from hybridnb.comparison.compare import random_windows

    x, y = random_windows(n, 129, 200, seed)
    return x, y.unsqueeze(1)


# ---------------------------------------------------------------------------------------------
# the child: one contender on one model, in a fresh process


def child(contender: str, model: str, batch: int, steps: int, device: str, t_spawn: float,
          compile_ok: bool) -> dict:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if contender == "hybridnb":
        import hybridnb  # noqa: F401
    elif contender == "lightning":
        import lightning  # noqa: F401
    t_imported = time.time()
    stamps: list[float] = []
    register_optimizer_step_post_hook(lambda opt, a, k: stamps.append(time.perf_counter()))
    x, y = windows(batch * min(steps, 40))  # 40 batches of data, cycled: same work for all
    torch.manual_seed(0)
    net = build_model(model)
    t_setup = time.perf_counter()
    fit = {"stock": _hand_loop, "best": _hand_loop, "hybridnb": _fit_hybridnb,
           "lightning": _fit_lightning}[contender]
    extra = fit(net, x, y, batch, steps, device, best=contender == "best",
                compile_ok=compile_ok) or {}
    if device == "cuda":
        torch.cuda.synchronize()
    t_end = time.perf_counter()
    warm = min(WARM, max(len(stamps) - 2, 0))
    steady = ((len(stamps) - warm - 1) * batch / (t_end - stamps[warm])
              if len(stamps) > warm + 1 else None)
    return {"import_s": t_imported - t_spawn, "fit_s": t_end - t_setup, "steps": len(stamps),
            "first_step_s": stamps[0] - t_setup if stamps else None,
            "samples_per_s": steady, **extra}


def _hand_loop(net, x, y, batch, steps, device, best, compile_ok):
    """Data moved to the device once, batches by indexing, AdamW; ``best`` adds the knobs."""
    import torch
    import torch.nn.functional as F

    net.to(device).train()
    xd, yd = x.to(device), y.to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    extra, autocast = {}, torch.autocast(device, dtype=torch.bfloat16, enabled=best)
    if best:
        from hybridnb.speedups import apply_speedups

        applied = apply_speedups(net, xd[:batch], device, "bf16", mode="all",
                                 knobs=["rewrite", "channels_last", "cudnn_benchmark"])
        extra["applied"] = applied.message
        if compile_ok:
            net = torch.compile(net)
    n = len(xd)
    for _ in range(steps):
        idx = torch.randint(0, n, (batch,), device=device)
        with autocast:
            loss = F.mse_loss(net(xd[idx]).float(), yd[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return extra


def _fit_hybridnb(net, x, y, batch, steps, device, best, compile_ok):
    import torch

    import hybridnb as hn

    kwargs = dict(loss="mse", lr=LR, epochs=1, batch_size=batch, live=False, verbose=False,
                  steps_per_epoch=steps, seed=0)
    reps = -(-steps * batch // len(x))  # enough data for `steps` steps
    ds = torch.utils.data.TensorDataset(x.repeat(reps, 1, 1), y.repeat(reps, 1))
    tr = hn.Trainer(net, **kwargs)
    hist = tr.fit(ds)
    row = hist.iloc[-1].to_dict() if len(hist) else {}
    return {"trainer_samples_per_s": row.get("samples_per_s"),
            "trainer_data_wait_pct": row.get("data_wait_pct"),
            "precision": tr.precision.name}


def _fit_lightning(net, x, y, batch, steps, device, best, compile_ok):
    import lightning as L
    import torch
    import torch.nn.functional as F

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, b, i):
            return F.mse_loss(self.net(b[0]), b[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch,
                                         shuffle=True, num_workers=0)
    trainer = L.Trainer(max_steps=steps, accelerator="gpu" if device == "cuda" else "cpu",
                        devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Module(), train_dataloaders=loader)


def profile_child(model: str, batch: int, device: str) -> dict:
    """Share of GPU kernel time in PyTorch's native depthwise kernel: bf16 stock (NCHW), bf16
    with apply_speedups(auto) as the Trainer would run it, and bf16 with every knob (eager)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from hybridnb.speedups import apply_speedups

    x, y = windows(batch)
    x, y = x.to(device), y.to(device)
    out = {}
    for label, mode in (("bf16 stock", "off"), ("bf16 + apply_speedups(auto)", "auto"),
                        ("bf16 + rewrite + channels_last", "all")):
        torch.manual_seed(0)
        net = build_model(model).to(device).train()
        applied = apply_speedups(net, x, device, "bf16" if device == "cuda" else "fp32", mode=mode,
                                 knobs=["rewrite", "channels_last", "cudnn_benchmark"])
        opt = torch.optim.AdamW(net.parameters(), lr=LR)

        def step(net=net, opt=opt):
            # (bf16 on the CPU sends EEGNeX's grouped conv to a oneDNN path that asks for 100+ GB)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = F.mse_loss(net(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for _ in range(3):
            step()
        activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            for _ in range(5):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
        total, depthwise = _kernel_time(prof, device)
        out[label] = {"depthwise_pct": 100 * depthwise / total if total else None,
                      "applied": applied.message}
    return out


def _kernel_time(prof, device: str) -> tuple[float, float]:
    """(all kernel time, native depthwise kernel time) in a profile; on the CPU (dry run), op
    self time stands in for kernel time."""
    from torch.autograd import DeviceType

    total = depthwise = 0.0
    for evt in prof.key_averages():
        if device == "cuda":
            if evt.device_type != DeviceType.CUDA:  # ops also carry their kernels' time
                continue
            t = evt.self_device_time_total
        else:
            t = evt.self_cpu_time_total
        total += t
        if DEPTHWISE_KERNEL in evt.key:
            depthwise += t
    return total, depthwise


# ---------------------------------------------------------------------------------------------
# the parent


def run_child(args: list[str], timeout: float = 420) -> dict:
    from bench.common import run_fresh

    return run_fresh("bench.bench_gpu", args, MARK, timeout)[0]


def gpu_section(device: str, batch: int, steps_scale: float, repeats: int,
                compile_ok: bool) -> tuple[str, list]:
    from bench.common import markdown_table

    try:
        import lightning  # noqa: F401
        contenders = CONTENDERS
        missing = ""
    except ImportError:
        contenders = tuple(c for c in CONTENDERS if c != "lightning")
        missing = " Lightning is not installed here: its row is left out."
    rows, goals, runs = [], [], {}
    for model in MODELS:
        steps = max(int(STEPS[model] * steps_scale), 3)
        for rnd in range(repeats):
            for c in contenders:
                r = run_child(["--child", c, "--model", model, "--batch", str(batch),
                               "--steps", str(steps), "--device", device]
                              + ([] if compile_ok else ["--no-compile"]))
                runs.setdefault((model, c), []).append(r)
                print(f"{model} round {rnd + 1}/{repeats} {c:9s}: "
                      f"{r.get('error') or _brief(r)}", flush=True)
        stock = _med(runs[(model, "stock")], "samples_per_s")
        for c in contenders:
            rs = [r for r in runs[(model, c)] if "error" not in r]
            if not rs:
                rows.append({"model": model, "run": LABEL[c],
                             "note": runs[(model, c)][0]["error"]})
                continue
            rate = _med(rs, "samples_per_s")
            rows.append({"model": model, "run": LABEL[c], "samples/s (wall, steady)": rate,
                         "vs stock": f"{rate / stock:.2f}x" if rate and stock else "",
                         "wall incl. start-up s": _med(rs, "total_s"),
                         "first step s": _med(rs, "first_step_s"),
                         "history samples/s": _med(rs, "trainer_samples_per_s") or "",
                         "note": rs[0].get("applied") or rs[0].get("precision") or ""})
        prof = run_child(["--profile", "--model", model, "--batch", str(batch),
                          "--device", device])
        profiles = {k: v for k, v in prof.items() if isinstance(v, dict)}
        for label, p in profiles.items():
            rows.append({"model": model, "run": f"profile: {label}",
                         "note": f"native depthwise kernel {p['depthwise_pct']:.1f}% of GPU time"
                         if p["depthwise_pct"] is not None else "no kernel time recorded"})
            if model == "eegnex" and "auto" in label and p["depthwise_pct"] is not None:
                goals.append((f"EEGNeX: native depthwise kernel < 5% of GPU time with "
                              f"apply_speedups(auto) (measured {p['depthwise_pct']:.1f}%)",
                              p["depthwise_pct"] < 5))
        if "error" in prof:
            rows.append({"model": model, "run": "profile", "note": prof["error"]})
    hn_rate = _med(runs.get(("eegnex", "hybridnb"), []), "samples_per_s")
    stock = _med(runs.get(("eegnex", "stock"), []), "samples_per_s")
    if hn_rate:
        goals.append((f"EEGNeX through hn.Trainer defaults >= 9,000 samples/s (measured "
                       f"{hn_rate:,.0f})", hn_rate >= 9000))
        if stock:
            goals.append((f"EEGNeX hn.Trainer >= 5x the stock fp32 loop (measured "
                          f"{hn_rate / stock:.2f}x)", hn_rate >= 5 * stock))
    lt = _med(runs.get(("eegnex", "lightning"), []), "total_s")
    ht = _med(runs.get(("eegnex", "hybridnb"), []), "total_s")
    if lt and ht:
        goals.append((f"EEGNeX hybridnb wall time incl. start-up <= 0.5x Lightning's (measured "
                      f"{ht / lt:.2f}x)", ht <= 0.5 * lt))
    body = (f"Batch {batch}, synthetic (129, 200) windows, AdamW lr {LR}; EEGNeX "
            f"{max(int(STEPS['eegnex'] * steps_scale), 3)} and ShallowFBCSPNet "
            f"{max(int(STEPS['shallow'] * steps_scale), 3)} optimizer steps per fresh process, "
            f"{repeats} interleaved round(s), medians. samples/s: wall clock from the end of "
            f"step {WARM} to the end of the run (device synchronised), data handling included; "
            f"'history samples/s' is what hn.Trainer's history reports. Hand loops keep the data "
            f"on the device and index batches; hn.Trainer and Lightning get the same tensors on "
            f"the host.{missing}\n\n" + markdown_table(rows))
    return body, goals


def cpu_section(batch: int, repeats: int, steps: int) -> tuple[str, list]:
    """EEGNeX on the CPU: stock, rewrite, channels_last, both; and what apply_speedups picks."""
    import torch
    import torch.nn.functional as F

    from bench.common import interleaved, markdown_table, median, spread
    from hybridnb.speedups import DEPTHWISE, apply_speedups

    x, y = windows(batch)
    nets = {}
    for label, rewrite, cl in (("stock", 0, 0), ("rewrite", 1, 0), ("channels_last", 0, 1),
                               ("rewrite + channels_last", 1, 1)):
        torch.manual_seed(0)
        net = build_model("eegnex").train()
        if rewrite:
            assert DEPTHWISE.apply(net, x[:4]), "EEGNeX's spatial conv should be rewritten"
        if cl:
            net = net.to(memory_format=torch.channels_last)
        nets[label] = (net, torch.optim.AdamW(net.parameters(), lr=LR))

    def timed(net, opt):
        def run():
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = F.mse_loss(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return (time.perf_counter() - t0) / steps
        return run

    for net, opt in nets.values():  # warm-up
        timed(net, opt)()
    results = interleaved({k: timed(*v) for k, v in nets.items()}, repeats=repeats)
    base = min(results["stock"])
    torch.manual_seed(0)
    auto_net = build_model("eegnex").train()
    applied = apply_speedups(auto_net, x, "cpu", "fp32")
    rows = [{"setting": k, "fastest step s": min(v), "median step s": median(v),
             "spread": spread(v), "samples/s (fastest)": batch / min(v),
             "vs stock (fastest)": f"{base / min(v):.2f}x",
             "vs stock (median)": f"{median(results['stock']) / median(v):.2f}x"}
            for k, v in results.items()]
    chosen = " + ".join(applied.applied) or "stock"
    ratio = base / min(results.get(chosen, results["stock"]))
    body = (f"EEGNeX, fp32, batch {batch}, forward + backward + AdamW; {repeats} interleaved "
            f"rounds of {steps} steps each. On a shared CPU other jobs only ever add time, so "
            f"the fastest round is the better estimate; medians beside it.\n\n"
            + markdown_table(rows)
            + f"\napply_speedups(mode='auto') on this CPU: {applied.message}.\n")
    goals = [(f"CPU: apply_speedups' choice ({chosen}) no slower than stock, within 5% noise "
              f"(measured {ratio:.2f}x)", ratio >= 0.95)]
    return body, goals


def _brief(r: dict) -> str:
    rate = r.get("samples_per_s")
    return (f"{r['total_s']:.1f} s total, fit {r['fit_s']:.1f} s, "
            + (f"{rate:,.0f} samples/s" if rate else "no steady rate"))


def _med(results: list[dict], key: str):
    vals = [r[key] for r in results if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None


def main(dry_run: bool) -> None:
    import torch

    from bench.common import load_note, write_result

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    parts, goals = [], []
    if torch.cuda.is_available() or dry_run:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        scale, batch, reps = (1.0, 256, 2) if not dry_run else (0.02, 8, 1)
        body, g = gpu_section(device, batch, scale, reps, compile_ok=not dry_run)
        where = (torch.cuda.get_device_name(0) if device == "cuda"
                 else "dry run on the CPU: code paths only, numbers meaningless")
        parts.append(f"## GPU ({where})\n\n{body}")
        goals += g
    else:
        reason = "no CUDA device here (torch.cuda.is_available() is False)"
        print(f"GPU section skipped: {reason}", flush=True)
        parts.append(f"## GPU\n\nSkipped: {reason}. Run on a GPU machine for the goal "
                     f"numbers.\n")
        goals += [("EEGNeX through hn.Trainer defaults >= 9,000 samples/s on an H100", None),
                  ("EEGNeX: native depthwise kernel < 5% of GPU time", None),
                  ("EEGNeX hybridnb wall time incl. start-up <= 0.5x Lightning's", None)]
    body, g = cpu_section(batch=8 if dry_run else 16, repeats=1 if dry_run else 4,
                          steps=1)
    parts.append(f"## CPU\n\n{body}")
    goals += g
    text = "\n".join(parts) + f"\nWhole benchmark: {time.perf_counter() - t0:.0f} s. " \
        f"{load_note(load0)}\n"
    if dry_run:
        print(text)
        return
    write_result("gpu", "Speed on a GPU (and the CPU check): knobs, Trainer, Lightning", text,
                 goals)


def _cli() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_gpu", description=__doc__.split(
        "\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="run the GPU section's code on the CPU, tiny; print, write nothing")
    p.add_argument("--child", choices=CONTENDERS)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--model", choices=MODELS, default="eegnex")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--t0", type=float, default=None)
    a = p.parse_args()
    if a.child:
        result = child(a.child, a.model, a.batch, a.steps, a.device, a.t0 or time.time(),
                       compile_ok=not a.no_compile)
        print(MARK + json.dumps(result, default=str), flush=True)
    elif a.profile:
        print(MARK + json.dumps(profile_child(a.model, a.batch, a.device), default=str),
              flush=True)
    else:
        main(a.dry_run)


if __name__ == "__main__":
    _cli()
