"""Precision and torch.compile variants of one training step, side by side, via hn.compare().

On this CPU machine: ShallowFBCSPNet at batch 64 with every variant (fp16 and compile modes the CPU
lacks show up as skipped rows), and EEGNeX at batch 8 eager only (one EEGNeX step takes seconds
here and compiling it about a minute). With a GPU: EEGNeX and ShallowFBCSPNet at batch 256 with
fp32 / bf16 / fp16 / +compile, bf16 with channels_last, the depthwise-as-matmul rewrite and
compile, NVML utilisation, and the achieved FLOP rate. Each variant runs in its own process.
Goal (H100): bf16 + compile >= 2x fp32 eager; GPU busy >= 80% of the time.
"""

from __future__ import annotations

import math
import os
import time

import torch

from bench.common import load_note, markdown_table, write_result

CPU_PLANS = [
    # (model, batch, variants, steps, warmup, repeats)
    ("shallow", 64, ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile",
                     "fp32+compile:max-autotune", "fp32"), 3, 1, 3),
    ("eegnex", 8, ("fp32", "bf16"), 2, 1, 2),
]
GPU_PLANS = [
    ("eegnex", 256, ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile",
                     "bf16+channels_last", "bf16+channels_last+rewrite",
                     "bf16+channels_last+rewrite+compile", "fp32"), 20, 5, 5),
    ("shallow", 256, ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile"), 20, 5, 5),
]
NAMES = {"eegnex": "EEGNeX", "shallow": "ShallowFBCSPNet"}

def flops_per_sample(model_fn, batch: int = 2) -> float:
    """Forward + backward FLOPs of one sample (the step module's counter; convs and matmuls)."""
    from hybridnb.comparison.compare import random_windows
    from hybridnb.train.step import count_flops

    torch.manual_seed(0)
    x, _ = random_windows(batch, *model_fn.input_shape)
    return count_flops(model_fn(), (x,)) / batch


def main() -> None:
    from hybridnb.comparison.compare import compare, random_windows
    from hybridnb.measure.throughput import peak_tflops
    from hybridnb_tools.models import MODELS

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    plans = GPU_PLANS if gpu else CPU_PLANS
    gpu_name = torch.cuda.get_device_name(0) if gpu else ""
    peak = peak_tflops(gpu_name, "bf16") if gpu else None  # dense bf16 peak, TFLOP/s
    sections, goals = [], []
    t_all, load0 = time.perf_counter(), os.getloadavg()[0]
    for model, batch, variants, steps, warmup, repeats in plans:
        print(f"\n## {NAMES[model]} · batch {batch} · {device}", flush=True)
        x, y = random_windows(batch, *MODELS[model].input_shape)
        df = compare(MODELS[model], (x, y), variants, steps=steps, warmup=warmup, repeats=repeats,
                     device=device)
        flops = flops_per_sample(MODELS[model])
        rows = []
        for r in df.to_dict("records"):
            ok = r["status"] == "ok"
            tflops = r["samples_per_s"] * flops / 1e12 if ok else math.nan
            rows.append({
                "variant": r["variant"], "status": r["status"],
                "samples/s": r["samples_per_s"] if ok else "–",
                "spread": f"{r['samples_per_s_min']:.4g}–{r['samples_per_s_max']:.4g}"
                if ok else "–",
                "speed-up": f"{r['speedup']:.2f}×" if ok else "–",
                "step ms": r["step_ms"] if ok else "–",
                "peak MiB": r["peak_mem_mb"] if ok else "–",
                "compile s": f"{r['compile_s']:.1f}" if ok and r["compile"] != "eager" else "–",
                "loss Δ vs fp32": f"{r['loss_rel_diff']:.1e}" if ok else "–",
                "GPU busy %": f"{r['gpu_busy_pct']:.0f}" if ok and gpu and
                not math.isnan(r["gpu_busy_pct"]) else "–",
                "TFLOP/s": f"{tflops:.3g}" if ok else "–",
                "note": r["note"],
            })
        a = df.attrs
        sections.append(
            f"## {NAMES[model]}, batch {batch}, {device}\n\n"
            f"{warmup} warm-up + 1 memory step, then {repeats} interleaved windows of {steps} "
            f"steps per variant (fwd + bwd + AdamW, random (129, 200) windows, planted linear "
            f"target); {torch.get_num_threads()} torch threads; {flops / 1e9:.3g} GFLOP per "
            f"sample (fwd + bwd); compare() took {a['elapsed_s']:.0f} s. Memory: weights + "
            f"optimizer state + batch + the step's peak working memory ({a['memory_method']}).\n\n"
            + markdown_table(rows))
        by = {r["variant"]: r for r in df.to_dict("records")}
        aa = by.get("fp32 #2")
        if aa and aa["status"] == "ok":
            same_speed = abs(aa["speedup"] - 1) <= 0.10
            goals.append((f"A/A check ({NAMES[model]}): fp32 measured twice agrees within 10% "
                          f"in speed (measured {aa['speedup']:.2f}×; more means a noisy machine)",
                          same_speed))
            if not gpu:  # GPU kernels may use atomics; the CPU path is deterministic
                goals.append((f"A/A check ({NAMES[model]}): same seed, same loss to the bit "
                              f"(Δ {aa['loss_rel_diff']:.1e})", aa["loss_rel_diff"] == 0.0))
        if model == "eegnex":
            bc = by.get("bf16+compile")
            if gpu and bc is not None and bc["status"] == "ok":
                goals.append((f"H100: bf16 + compile >= 2x fp32 eager on EEGNeX batch 256 "
                              f"(measured {bc['speedup']:.2f}× on {gpu_name})",
                              bc["speedup"] >= 2.0 if "H100" in gpu_name else None))
                busy = bc["gpu_busy_pct"]
                goals.append((f"GPU busy >= 80% of the time in bf16 + compile (NVML: "
                              f"{busy:.0f}%)" if not math.isnan(busy) else
                              "GPU busy >= 80% (NVML utilisation not readable)",
                              busy >= 80 if not math.isnan(busy) else None))
                if peak:
                    sections.append(
                        f"bf16 + compile reaches {bc['samples_per_s'] * flops / 1e12:.3g} TFLOP/s, "
                        f"{bc['samples_per_s'] * flops / 1e12 / peak:.1%} of the {peak:.0f} "
                        f"TFLOP/s dense bf16 peak of a {gpu_name}.")
            elif not gpu:
                goals.append(("H100: bf16 + compile >= 2x fp32 eager on EEGNeX batch 256 "
                              "(no GPU on this machine)", None))
                goals.append(("GPU busy >= 80% of the time (no GPU on this machine)", None))
    where = (f"GPU {gpu_name}" if gpu else
             f"CPU only ({os.cpu_count()} cores); EEGNeX compile variants not run here: "
             f"compiling EEGNeX on this CPU takes about a minute per variant")
    body = (f"{where}. Whole benchmark: {time.perf_counter() - t_all:.0f} s. "
            f"{load_note(load0)}\n\n"
            + "\n".join(sections))
    write_result("compare", "hn.compare(): precision and compile variants", body, goals)


if __name__ == "__main__":
    main()
