"""The hardware report as text (terminals, CI logs) and as an HTML table (notebooks).

``detect`` uses the views for ``Hardware.__str__``; the views take its ``Hardware`` as ``Any``
(importing the class here would make an import cycle).
"""

from __future__ import annotations

import html as _html
import time
from typing import Any

from hybridnb.hardware.gpu_info import GpuInfo, gib
from hybridnb.hardware.probe.result import TITLES, ProbeResult

SETTING_ROWS = ("batch_size", "grad_accum", "num_workers", "pin_memory", "persistent_workers",
                "strategy", "compile", "torch_threads")
_MARK = {"ok": "ok", "failed": "FAILED", "wrong": "WRONG", "hung": "HUNG", "crashed": "CRASHED",
         "not run": "-"}


def _host_line(hw: Any) -> str:
    h = hw.host
    cores = f"{h.cores_usable} usable core{'s' if h.cores_usable != 1 else ''}"
    if h.cores_logical != h.cores_usable:
        cores += f" (of {h.cores_logical})"
    return (f"{cores}, RAM {gib(h.ram_total)} ({gib(h.ram_available)} available); {h.cpu}; "
            f"{h.system}; Python {h.python}")


def _torch_line(hw: Any) -> str:
    b = hw.build
    kind = f"ROCm {b.hip}" if b.hip else (f"CUDA {b.cuda}" if b.cuda else "CPU-only")
    return f"torch {b.torch} ({kind} build)"


def _gpu_facts(g: GpuInfo) -> str:
    parts = [g.backend.upper() if g.backend != "rocm" else "ROCm"]
    if g.capability:
        parts.append(f"capability {g.capability[0]}.{g.capability[1]}")
    if g.arch:
        parts.append(g.arch)
    if g.total_memory:
        free = f", {gib(g.free_memory)} free" if g.free_memory is not None else ""
        parts.append(f"{gib(g.total_memory)}{free}")
    if g.driver_version:
        parts.append(f"driver {g.driver_version}" + (f" (CUDA {g.driver_cuda})"
                                                    if g.driver_cuda else ""))
    if g.runtime_version:
        parts.append(f"runtime {g.runtime_version}")
    if g.native_bf16 is not None:
        parts.append("native bf16" if g.native_bf16 else "no native bf16")
    if not g.usable:
        parts.append("NOT USED (known problem)")
    return ", ".join(parts)


def proven(p: ProbeResult, now: float | None = None) -> str:
    """When and how the GPU was last proven, in a phrase: "passed every probe step in 4.2 s"
    (+ "(cached: proven 3.1 h ago, at 2026-11-21 09:12; detect(refresh=True) probes again)")."""
    text = f"passed every probe step in {p.seconds:.1f} s"
    if p.cached and p.proven_at is not None:
        age = max(0.0, (time.time() if now is None else now) - p.proven_at)
        ago = f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min"
        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(p.proven_at))
        text += f" (cached: proven {ago} ago, at {at}; detect(refresh=True) probes again)"
    return text


def _probe_line(g: GpuInfo) -> str:
    p = g.probe
    if p is None:
        return "not probed"
    steps = " > ".join(f"{TITLES[s.name]} {_MARK[s.status]}"
                       + (f" {s.seconds:.2f}s" if s.seconds is not None else "") for s in p.steps)
    head = f"probe {p.verdict.upper()} in {p.seconds:.1f} s"
    if p.cached:
        head = f"probe PASSED, {proven(p).replace('passed every probe step in ', 'in ')}"
    return f"{head}: {steps}" + (f"\n      {p.message}" if p.message else "")


def text(hw: Any) -> str:
    """The readable terminal report."""
    s = hw.settings
    lines = [f"hybridnb.detect()  ({hw.seconds:.2f} s, frontend: {hw.frontend})", ""]
    lines.append(f"  device     {str(hw.device):<8} {s.reasons.get('device', '')}")
    lines.append(f"  precision  {hw.precision:<8} {s.reasons.get('precision', '')}")
    lines.append(f"  host       {_host_line(hw)}")
    lines.append(f"  torch      {_torch_line(hw)}")
    lines.append("")
    if hw.gpus:
        lines.append("GPUs")
        for g in hw.gpus:
            lines.append(f"  [{g.torch_device}] {g.name}: {_gpu_facts(g)}")
            lines.append(f"      {_probe_line(g)}")
    else:
        lines.append("GPUs: none")
    lines.append("")
    lines.append(f"Settings (effective batch {s.effective_batch})")
    width = max(len(k) for k in SETTING_ROWS)
    for key in SETTING_ROWS:
        value = str(getattr(s, key))
        lines.append(f"  {key:<{width}}  {value:<7} {s.reasons.get(key, '')}")
    for title, items, mark in (("Warnings", hw.warnings, "!"), ("Advice", hw.advice, "-"),
                               ("Notes", hw.notes, "-")):
        if items:
            lines.append("")
            lines.append(title)
            lines.extend(f"  {mark} {item}" for item in items)
    return "\n".join(lines)


def html(hw: Any) -> str:
    """One self-contained HTML table for notebooks (no scripts, no external CSS)."""
    e = _html.escape
    s = hw.settings
    td = 'style="text-align:left;padding:2px 8px;vertical-align:top"'
    th = 'style="text-align:left;padding:4px 8px;background:rgba(127,127,127,0.15)" colspan="3"'

    def row(name: str, value: str, why: str = "") -> str:
        return (f"<tr><td {td}><b>{e(name)}</b></td><td {td}><code>{e(value)}</code></td>"
                f"<td {td}>{e(why)}</td></tr>")

    def section(title: str) -> str:
        return f"<tr><th {th}>{e(title)}</th></tr>"

    out = ['<table style="border-collapse:collapse;font-size:13px">',
           f"<caption style='text-align:left'><b>hybridnb.detect()</b> &middot; "
           f"{hw.seconds:.2f} s &middot; {e(hw.frontend)}</caption>",
           section("Choice"),
           row("device", str(hw.device), s.reasons.get("device", "")),
           row("precision", hw.precision, s.reasons.get("precision", "")),
           section("Host"),
           row("cores", str(hw.host.cores_usable), _host_line(hw)),
           row("torch", hw.build.torch, _torch_line(hw))]
    out.append(section(f"GPUs ({len(hw.gpus)})"))
    if not hw.gpus:
        out.append(row("-", "none", "; ".join(hw.notes[:1])))
    for g in hw.gpus:
        verdict = g.probe.verdict if g.probe is not None else "not probed"
        if g.probe is not None and g.probe.cached:
            verdict += " (cached)"
        color = "#1a7f37" if g.trusted else "#cf222e"
        steps = "".join(
            f"<li>{e(TITLES[st.name])}: <b>{e(_MARK[st.status])}</b>"
            + (f" {st.seconds:.2f} s" if st.seconds is not None else "")
            + (f" &ndash; {e(st.detail)}" if st.detail else "") + "</li>"
            for st in (g.probe.steps if g.probe is not None else []))
        out.append(
            f"<tr><td {td}><b>{e(g.torch_device)}</b></td><td {td}>{e(g.name)}<br>"
            f"<span style='color:{color}'><b>{e(verdict)}</b></span></td>"
            f"<td {td}>{e(_gpu_facts(g))}<ul style='margin:2px 0'>{steps}</ul>"
            + (f"{e(g.probe.message)}" if g.probe is not None and g.probe.message else "")
            + (f"{e(proven(g.probe))}" if g.probe is not None and g.probe.cached else "")
            + "</td></tr>")
    out.append(section(f"Settings (effective batch {s.effective_batch})"))
    out.extend(row(k, str(getattr(s, k)), s.reasons.get(k, "")) for k in SETTING_ROWS)
    for title, items in (("Warnings", hw.warnings), ("Advice", hw.advice), ("Notes", hw.notes)):
        if items:
            out.append(section(title))
            color = "color:#cf222e;" if title == "Warnings" else ""
            out.extend(f"<tr><td colspan='3' style='text-align:left;padding:2px 8px;{color}'>"
                       f"{e(i)}</td></tr>" for i in items)
    out.append("</table>")
    return "\n".join(out)
