"""The hardware report as text (terminals, CI logs) and as an HTML table (notebooks), both
from ``_sections``. ``Hardware`` is typed ``Any``: importing it here would make a cycle.
"""

from __future__ import annotations

import html as _html
import time
from typing import Any

from hybridnb.hardware.gpu_info import GpuInfo, gib
from hybridnb.hardware.probe import TITLES, ProbeResult

SETTING_ROWS = ("batch_size", "grad_accum", "num_workers", "pin_memory", "persistent_workers",
                "strategy", "compile", "torch_threads")
_MARK = {"ok": "ok", "not run": "-"}  # else the status in capitals: FAILED, HUNG, ...


def cached(p: ProbeResult) -> str:
    """' (cached: proven 3.1 h ago, at 2026-11-21 09:12; ...)' for a verdict from disk, or ""."""
    if not p.cached or p.proven_at is None:
        return ""
    age = max(0.0, time.time() - p.proven_at)
    ago = f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min"
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(p.proven_at))
    return f" (cached: proven {ago} ago, at {at}; detect(refresh=True) probes again)"


def _gpu_facts(g: GpuInfo) -> str:
    memory = g.total_memory and gib(g.total_memory) + (
        f", {gib(g.free_memory)} free" if g.free_memory is not None else "")
    driver = g.driver_version and f"driver {g.driver_version}" + (
        f" (CUDA {g.driver_cuda})" if g.driver_cuda else "")
    parts = ["ROCm" if g.backend == "rocm" else g.backend.upper(),
             g.capability and f"capability {g.capability[0]}.{g.capability[1]}", g.arch, memory,
             driver, g.runtime_version and f"runtime {g.runtime_version}",
             {True: "native bf16", False: "no native bf16"}.get(g.native_bf16),
             not g.usable and "NOT USED (known problem)"]
    return ", ".join(p for p in parts if p)


def _probe_lines(g: GpuInfo) -> list[str]:
    p = g.probe
    if p is None:
        return ["not probed"]
    head = f"probe {p.verdict.upper()} in {p.seconds:.1f} s{cached(p)}"
    steps = " > ".join(f"{TITLES[s.name]} {_MARK.get(s.status, s.status.upper())}"
                       + (f" {s.seconds:.2f}s" if s.seconds is not None else "")
                       for s in p.steps)
    return [f"{head}: {steps}"] + ([p.message] if p.message else [])


def _sections(hw: Any) -> list[tuple[str, list[tuple[str, str, list[str]]]]]:
    """(title, rows); a row is (name, value, lines of explanation)."""
    s, h, b = hw.settings, hw.host, hw.build
    cores = f"{h.cores_usable} usable core{'s' if h.cores_usable != 1 else ''}"
    if h.cores_logical != h.cores_usable:
        cores += f" (of {h.cores_logical})"
    build = f"ROCm {b.hip}" if b.hip else (f"CUDA {b.cuda}" if b.cuda else "CPU-only")
    gpus = [(g.torch_device, g.name, [_gpu_facts(g), *_probe_lines(g)]) for g in hw.gpus]
    out = [
        ("Choice", [("device", str(hw.device), [s.reasons.get("device", "")]),
                    ("precision", hw.precision, [s.reasons.get("precision", "")])]),
        ("Host", [("host", "",
                   [f"{cores}, RAM {gib(h.ram_total)} ({gib(h.ram_available)} available); "
                    f"{h.cpu}; {h.system}; Python {h.python}"]),
                  ("torch", "", [f"torch {b.torch} ({build} build)"])]),
        (f"GPUs ({len(hw.gpus)})" if hw.gpus else "GPUs: none", gpus),
        (f"Settings (effective batch {s.effective_batch})",
         [(k, str(getattr(s, k)), [s.reasons.get(k, "")]) for k in SETTING_ROWS]),
    ]
    out += [(title, [("", "", [item]) for item in items])
            for title, items in (("Warnings", hw.warnings), ("Advice", hw.advice),
                                 ("Notes", hw.notes)) if items]
    return out


def text(hw: Any) -> str:
    lines = [f"hybridnb.detect()  ({hw.seconds:.2f} s, frontend: {hw.frontend})"]
    for title, rows in _sections(hw):
        lines += ["", title]
        width = max((len(name) for name, _, _ in rows), default=0)
        for name, value, why in rows:
            if not name:
                lines.append(f"  {'!' if title == 'Warnings' else '-'} {why[0]}")
            else:
                value = f"{value:<8} " if value else ""
                lines.append(f"  {name:<{width}}  {value}{why[0]}".rstrip())
                lines.extend(f"      {line}" for line in why[1:])
    return "\n".join(lines)


def html(hw: Any) -> str:
    """One self-contained HTML table for notebooks (no scripts, no external CSS)."""
    e = _html.escape
    td = 'style="text-align:left;padding:2px 8px;vertical-align:top"'
    th = 'style="text-align:left;padding:4px 8px;background:rgba(127,127,127,0.15)" colspan="3"'
    out = ['<table style="border-collapse:collapse;font-size:13px">',
           f"<caption style='text-align:left'><b>hybridnb.detect()</b> &middot; "
           f"{hw.seconds:.2f} s &middot; {e(hw.frontend)}</caption>"]
    for title, rows in _sections(hw):
        out.append(f"<tr><th {th}>{e(title)}</th></tr>")
        color = "color:#cf222e;" if title == "Warnings" else ""
        for name, value, why in rows:
            body = "<br>".join(e(line) for line in why)
            out.append(f"<tr><td colspan='3' style='text-align:left;padding:2px 8px;{color}'>"
                       f"{body}</td></tr>" if not name else
                       f"<tr><td {td}><b>{e(name)}</b></td><td {td}><code>{e(value)}</code>"
                       f"</td><td {td}>{body}</td></tr>")
    out.append("</table>")
    return "\n".join(out)
