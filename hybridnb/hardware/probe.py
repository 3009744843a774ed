"""Validate a GPU in a child process, step by step, under a hard timeout.

A flaky card (an unsupported ROCm GPU, a wedged driver) can hang or crash the process that
touches it, so the parent never does. It starts ``python -m hybridnb.hardware.probe --backend B --index N``
in a new process group; the child runs the steps below and writes one JSON line as each step
starts and ends, so that when it hangs the parent knows which step. At the deadline the parent
kills the whole group and reaps it: no orphan, no zombie.

Steps: import torch -> device available -> memory query -> small tensor -> matrix product checked
against the CPU result -> copy back (a round trip compared bit for bit).

Testing without a GPU: the child (and only the child) reads ``HYBRIDNB_PROBE_SIMULATE``, a JSON
object such as ``{"hang_at": "matmul"}``. With it set the steps run on CPU tensors while
pretending to be a GPU, and inject the fault asked for: ``hang_at`` (+ ``helper``: start a
helper process first, to show the group kill), ``crash_at`` (a SIGSEGV; "exit": after
the last step, as a driver teardown can),
``error_at`` (+ ``message``: an exception, e.g. a real CUDA error text), ``wrong_at``
("matmul" | "copy_back": corrupt the device result), ``gpu`` (properties to report),
``torch: false`` (skip importing torch until a tensor step needs it: fast, for timing tests)
and ``by_index`` ({"1": {...}}: settings for one GPU index only).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STEPS = ("import", "available", "memory", "tensor", "matmul", "copy_back")
TITLES = {"import": "import torch", "available": "device available", "memory": "memory query",
          "tensor": "small tensor", "matmul": "matmul vs CPU", "copy_back": "copy back"}
SIMULATE_ENV = "HYBRIDNB_PROBE_SIMULATE"
REAP_S = 0.5              # after the deadline: time to collect killed children
MATMUL_TOLERANCE = 1e-3   # max |gpu - cpu| / max |cpu| for a 256x256 fp32 product (TF32 off)


@dataclass
class StepResult:
    name: str
    status: str              # "ok" | "failed" | "wrong" | "hung" | "crashed" | "not run"
    seconds: float | None = None
    detail: str = ""


@dataclass
class ProbeResult:
    """What one probe child did. ``verdict``: passed | failed | wrong result | hung | crashed."""

    backend: str
    index: int
    verdict: str
    steps: list[StepResult]
    seconds: float
    message: str = ""                 # one sentence for the report ("" when passed)
    failed_step: str | None = None
    info: dict = field(default_factory=dict)   # properties the child read from the device
    returncode: int | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# ====================================================================== parent side

def run_probes(targets: list[tuple[str, int]], timeout: float) -> list[ProbeResult]:
    """Probe each (backend, index) in its own child, all at once, sharing one deadline.

    Returns within ``timeout`` plus at most ``REAP_S`` whatever the children do; children still
    running then are killed with their process groups and reaped, also when this call is
    interrupted (KeyboardInterrupt in a notebook).
    """
    deadline = time.monotonic() + timeout
    children: list[_Child] = []
    try:
        children.extend(_Child(backend, index) for backend, index in targets)
        for child in children:
            child.wait_until(deadline)
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.kill_group()
        reap_by = time.monotonic() + REAP_S
        for child in children:
            child.reap(reap_by)
    return [child.result(timeout) for child in children]


class _Child:
    """One probe process: started in its own process group, read line by line by a thread."""

    def __init__(self, backend: str, index: int) -> None:
        self.backend, self.index = backend, index
        self.events: list[dict] = []
        self.timed_out = False
        self.closed_at: float | None = None
        self.started = time.monotonic()
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridnb.hardware.probe", "--backend", backend, "--index", str(index)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr,
            env=_child_env(), **_new_group())
        self.reader = threading.Thread(target=self._read, name=f"probe-{index}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.events.append(json.loads(raw))
            except ValueError:
                continue  # a stray line; the protocol lines are JSON objects
        self.closed_at = time.monotonic()  # the child exited (or was killed)

    def wait_until(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = True

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (helpers it started too)."""
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, by: float) -> None:
        """Collect the exit status (no zombie) and the last output lines, waiting until ``by``.

        A child stuck in a driver call cannot die until the call returns; it is then left to
        subprocess's own later reaping, and the report says so.
        """
        try:
            self.proc.wait(timeout=max(0.0, by - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=max(0.0, by - time.monotonic()))
        self.seconds = (self.closed_at or time.monotonic()) - self.started
        if self.proc.stdout is not None and not self.reader.is_alive():
            self.proc.stdout.close()  # (a reader still blocked means a helper escaped the group)

    def result(self, timeout: float) -> ProbeResult:
        steps = {name: StepResult(name, "not run") for name in STEPS}
        current, info, failure, ended = None, {}, None, False
        for ev in list(self.events):
            kind, name = ev.get("e"), ev.get("step")
            if kind == "start" and name in steps:
                current = name
            elif kind == "ok" and name in steps:
                steps[name] = StepResult(name, "ok", ev.get("s"), ev.get("detail", ""))
                current = None
            elif kind == "fail" and name in steps:
                status = "wrong" if ev.get("wrong") else "failed"
                steps[name] = StepResult(name, status, ev.get("s"), ev.get("error", ""))
                failure, current = (name, status, ev.get("error", "")), None
            elif kind == "info":
                info.update(ev.get("info", {}))
            elif kind == "end":
                ended = True
        rc = self.proc.returncode
        res = ProbeResult(self.backend, self.index, "passed", list(steps.values()),
                          round(self.seconds, 3), info=info, returncode=rc)
        where = current or _next_step(steps)
        if ended and (self.timed_out or rc != 0):  # every step passed; only the exit went wrong
            res.message = ("every step passed, but the probe process " + (
                "did not exit in time and was killed" if self.timed_out else
                f"ended with {_exit_reason(rc).replace(' before finishing', '')}")
                + " while shutting down (a driver teardown problem; training may still work)")
        elif self.timed_out:
            res.verdict, res.failed_step = "hung", where
            steps[where].status, steps[where].detail = "hung", f"no answer within {timeout:g} s"
            since = _started_at(self.events, where)
            res.message = (f"hung at step '{TITLES[where]}' (no answer for {timeout:g} s"
                           + (f", {since:.1f} s in that step" if since is not None else "")
                           + "); the probe process was killed")
            if rc is None:
                res.message += " but could not be reaped (stuck in the driver?)"
        elif failure is not None:
            name, status, error = failure
            res.verdict = "wrong result" if status == "wrong" else "failed"
            res.failed_step = name
            first = (error.strip().splitlines() or [""])[0]
            res.message = f"{'wrong result' if status == 'wrong' else 'failed'} at step " \
                          f"'{TITLES[name]}': {first}"
        elif not ended or rc != 0:
            res.verdict, res.failed_step = "crashed", where
            why = _exit_reason(rc)
            tail = self._stderr_tail()
            steps[where].status, steps[where].detail = "crashed", why
            at = f"at step '{TITLES[where]}'" if self.events else "before its first step"
            res.message = f"crashed {at} ({why})" + (f": {tail}" if tail else "")
        res.steps = list(steps.values())
        self.stderr.close()
        return res

    def _stderr_tail(self, limit: int = 400) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-limit:]


def _next_step(steps: dict[str, StepResult]) -> str:
    return next((n for n in STEPS if steps[n].status == "not run"), STEPS[-1])


def _started_at(events: list[dict], step: str) -> float | None:
    t0 = next((ev.get("t") for ev in events if ev.get("e") == "start" and ev.get("step") == step),
              None)
    return None if t0 is None else max(0.0, time.time() - t0)


def _exit_reason(rc: int | None) -> str:
    if rc is None:
        return "did not exit"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc} before finishing"


def _child_env() -> dict[str, str]:
    """The caller's environment, plus the path that holds this package (a notebook may have
    added it to sys.path only) and unbuffered output."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _new_group() -> dict:
    if os.name == "posix":
        return {"start_new_session": True}
    return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}


# ====================================================================== child side

class _WrongResult(Exception):
    """The device computed, but not what the CPU computed."""


def main(argv: list[str] | None = None) -> int:
    """Child entry point: run the steps for one device, one JSON line per event on stdout."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hybridnb.hardware.probe")
    parser.add_argument("--backend", choices=("cuda", "rocm", "mps"), required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)

    # The protocol owns the real stdout; anything else printed (by torch, drivers) goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(**event) -> None:
        out.write(json.dumps(event, default=str) + "\n")
        out.flush()

    sim = _simulation(args.index)
    ctx: dict = {"backend": args.backend, "index": args.index, "sim": sim, "emit": emit}
    for name in STEPS:
        emit(e="start", step=name, t=time.time())
        t0 = time.perf_counter()
        try:
            _inject(sim, name, emit)
            detail = _STEP_FUNCS[name](ctx) or ""
        except _WrongResult as exc:
            emit(e="fail", step=name, s=round(time.perf_counter() - t0, 4), error=str(exc),
                 wrong=True)
            _exit(out, 1)
        except BaseException as exc:  # noqa: BLE001 - report any failure, then stop
            emit(e="fail", step=name, s=round(time.perf_counter() - t0, 4),
                 error=f"{type(exc).__name__}: {str(exc).strip()[:500]}")
            _exit(out, 1)
        emit(e="ok", step=name, s=round(time.perf_counter() - t0, 4), detail=detail)
    emit(e="end")
    _inject(sim, "exit", emit)
    _exit(out, 0)
    return 0


def _exit(out, code: int) -> None:
    """Leave without the interpreter's teardown (about 1 s with torch loaded); the OS frees
    the device. Output is flushed first."""
    out.close()
    sys.stderr.flush()
    os._exit(code)


def _simulation(index: int) -> dict | None:
    raw = os.environ.get(SIMULATE_ENV)
    if not raw:
        return None
    try:
        sim = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"{SIMULATE_ENV}={raw!r} is not valid JSON: {exc}") from exc
    merged = {k: v for k, v in sim.items() if k != "by_index"}
    merged.update(sim.get("by_index", {}).get(str(index), {}))
    return merged


def _inject(sim: dict | None, step: str, emit) -> None:
    if not sim:
        return
    if sim.get("hang_at") == step:
        if sim.get("helper"):  # a helper process in the same group, as drivers sometimes start
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            emit(e="info", info={"helper_pid": helper.pid})
        while True:  # a hang: nothing more is written, as with a wedged driver call
            time.sleep(3600)
    if sim.get("crash_at") == step:
        if hasattr(signal, "SIGSEGV") and os.name == "posix":
            os.kill(os.getpid(), signal.SIGSEGV)
        os.abort()
    if sim.get("error_at") == step:
        raise RuntimeError(sim.get("message") or "CUDA error: an illegal memory access was "
                           "encountered\nCUDA kernel errors might be asynchronously reported at "
                           "some other API call, so the stacktrace below might be incorrect.")
    if step != "import" and sim.get("delay"):
        time.sleep(float(sim["delay"]))


def _step_import(ctx: dict) -> str:
    if ctx["sim"] is not None and ctx["sim"].get("torch") is False:
        ctx["torch"] = None  # imported later, only if a step needs it
        return "skipped (simulation without torch)"
    import torch

    ctx["torch"] = torch
    return f"torch {torch.__version__}"


def _torch(ctx: dict):
    """torch for the tensor steps (a light simulation imports it only here)."""
    if ctx.get("torch") is None:
        import torch

        ctx["torch"] = torch
    if ctx.get("device") is None:
        ctx["device"] = ctx["torch"].device("cpu")
    return ctx["torch"]


def _step_available(ctx: dict) -> str:
    import warnings

    torch, sim, backend, index = ctx["torch"], ctx["sim"], ctx["backend"], ctx["index"]
    if sim is not None:
        gpu = {"name": "Simulated GPU", "total_memory": 16 * 2**30, "capability": [8, 0],
               **sim.get("gpu", {})}
        ctx["device"], ctx["sync"] = None, (lambda: None)  # CPU tensors, see _torch()
        ctx["emit"](e="info", info={**gpu, "simulated": True})
        return f"{gpu['name']} (simulated on the CPU)"
    if backend == "mps":
        if not torch.backends.mps.is_available():
            raise RuntimeError("torch.backends.mps.is_available() is False")
        ctx["device"], ctx["sync"] = torch.device("mps"), torch.mps.synchronize
        ctx["emit"](e="info", info={"name": "Apple GPU (MPS)"})
        return "MPS available"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    if not available:
        why = " ".join(str(w.message) for w in caught).strip()
        raise RuntimeError("torch.cuda.is_available() is False" + (f": {why}" if why else ""))
    if index >= count:
        raise RuntimeError(f"torch sees {count} device(s); index {index} does not exist")
    props = torch.cuda.get_device_properties(index)
    info = {"name": props.name, "total_memory": int(props.total_memory),
            "capability": [props.major, props.minor], "count": count,
            "arch_list": torch.cuda.get_arch_list(),
            "runtime": torch.version.hip or torch.version.cuda}
    arch = getattr(props, "gcnArchName", None)
    if torch.version.hip and arch:
        info["arch"] = arch.split(":")[0]
    ctx["device"] = torch.device("cuda", index)
    ctx["sync"] = lambda: torch.cuda.synchronize(ctx["device"])
    torch.backends.cuda.matmul.allow_tf32 = False  # compare true fp32 against the CPU
    ctx["emit"](e="info", info=info)
    return f"{props.name}, {count} device(s) visible"


def _step_memory(ctx: dict) -> str:
    torch, sim = ctx["torch"], ctx["sim"]
    if sim is not None:
        total = int(sim.get("gpu", {}).get("total_memory", 16 * 2**30))
        free = int(sim.get("gpu", {}).get("free_memory", total * 0.95))
    elif ctx["device"].type == "mps":
        total = int(torch.mps.recommended_max_memory())
        free = total - int(torch.mps.current_allocated_memory())
    else:
        free, total = (int(v) for v in torch.cuda.mem_get_info(ctx["device"]))
    ctx["emit"](e="info", info={"free_memory": free, "total_memory": total})
    return f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def _step_tensor(ctx: dict) -> str:
    torch = _torch(ctx)
    x = torch.arange(4096, dtype=torch.float32, device=ctx["device"])
    got = float((x * 2).sum().item())
    ctx["sync"]()
    expected = 4095 * 4096.0
    if got != expected:
        raise _WrongResult(f"sum of 2*arange(4096) gave {got}, expected {expected}")
    return "4096 floats allocated and summed"


def _step_matmul(ctx: dict) -> str:
    torch = _torch(ctx)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=gen)
    b = torch.randn(256, 256, generator=gen)
    ref = a @ b
    out = a.to(ctx["device"]) @ b.to(ctx["device"])
    ctx["sync"]()
    if (ctx["sim"] or {}).get("wrong_at") == "matmul":
        out = out.clone()
        out[17, 42] += 0.5 * float(ref.abs().max())  # a corrupted element, as a bad card gives
    err = float((out - ref.to(out.device)).abs().max().item()) / float(ref.abs().max())
    if not err <= MATMUL_TOLERANCE:  # also catches NaN
        raise _WrongResult(f"256x256 fp32 product differs from the CPU result: max relative "
                           f"error {err:.2e} (tolerance {MATMUL_TOLERANCE:g})")
    return f"max relative error {err:.1e} vs CPU"


def _step_copy_back(ctx: dict) -> str:
    torch = _torch(ctx)
    host = torch.randint(-2**31, 2**31 - 1, (1 << 20,), dtype=torch.int32,
                         generator=torch.Generator().manual_seed(1))
    dev = host.to(ctx["device"])
    if (ctx["sim"] or {}).get("wrong_at") == "copy_back":
        dev = dev.clone()
        dev[1000:1010] = 0
    back = dev.cpu()
    ctx["sync"]()
    bad = int((back != host).sum())
    if bad:
        raise _WrongResult(f"4 MiB round trip host -> device -> host changed {bad} values")
    return "4 MiB round trip identical"


_STEP_FUNCS = {"import": _step_import, "available": _step_available, "memory": _step_memory,
               "tensor": _step_tensor, "matmul": _step_matmul, "copy_back": _step_copy_back}


if __name__ == "__main__":
    sys.exit(main())
