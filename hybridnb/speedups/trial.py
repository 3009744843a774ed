"""Timed trials: a knob off and on, interleaved (A B A B) after one untimed step of each
(allocation, cuDNN autotuning, layout conversion), on the first batch, the model's state put back.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator

import psutil
import torch
from torch import nn

from hybridnb import platform
from hybridnb.failures import free_memory
from hybridnb.measure.timing import synchronize
from hybridnb.speedups.exact import first_tensor
from hybridnb.torch_state import set_torch_rng_state as set_rng_state
from hybridnb.torch_state import torch_rng_state as rng_state

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
RUN_SHARE = 0.1  # a CPU trial costs at most this share of the run's stock steps


def autocast(name: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward's context for precision ``name`` (a no-op for fp32)."""
    if name not in DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[name])


def race(toggle: Callable[[bool], str | None], model: nn.Module, inputs: tuple,
         device: torch.device, prec: str, budget: float, min_rounds: int | None = None
         ) -> float | str:
    """The knob's gain (off time / on time, fastest step of each) within about ``budget`` s, or
    why it was not measured (a step failed, or on the CPU a warm-up step too slow for
    ``min_rounds`` rounds)."""
    times = {False: [], True: []}
    if min_rounds is None:
        min_rounds = 2 if device.type == "cpu" else 1
    t_end = time.perf_counter() + budget  # warm-ups included
    try:
        for state in (False, True):
            warm = timed_step(toggle, state, model, inputs, device, prec)
            if device.type == "cpu" and not state and (2 * min_rounds + 2) * warm > budget:
                toggle(False)
                return f"not measured: a step takes {warm:.2g} s here (budget {budget:.2g} s)"
        while (len(times[True]) < min_rounds or time.perf_counter() < t_end) \
                and len(times[True]) < 20:
            for state in (False, True):
                times[state].append(timed_step(toggle, state, model, inputs, device, prec))
    except Exception as exc:  # noqa: BLE001 — a knob that breaks the step is simply not kept
        failed = f"its timed step failed ({type(exc).__name__}: {str(exc)[:80]})"
    else:
        return min(times[False]) / min(times[True])
    toggle(False)
    free_memory(device)  # outside the except: the failed step's tensors are free now
    return failed


def paired(step: Callable[[bool], float], budget: float, run_steps: int | None = None,
           rounds: int = 3, clear: float = 1.3) -> list[float] | str:
    """Paired ratios (stock time / candidate time) of ``step(on)``, one step each way per round
    after an untimed one of each (oneDNN's primitives, the layout's copies), or why none. Two to
    ``rounds`` rounds (two past ``clear`` either way end it), within ``budget`` s and
    ``RUN_SHARE`` of ``run_steps`` stock steps: a short run is not worth a trial."""
    least = 6  # the warm-ups and two rounds: a run too short for them is not timed at all
    if run_steps is not None and RUN_SHARE * run_steps < least:
        return (f"not measured: a run of {run_steps} steps is too short for a trial (it takes "
                f"{least} steps, at most {RUN_SHARE:.0%} of the run)")
    warm = step(False) + step(True)
    stock = warm / 2
    if run_steps is not None:
        budget = min(budget, RUN_SHARE * run_steps * stock)
    if 3 * warm > budget:  # the warm-ups and two rounds of the same cost
        return (f"not measured: a step takes {stock:.2g} s here, the trial's budget is "
                f"{budget:.2g} s")
    spent, ratios, last = warm, [], warm
    while len(ratios) < rounds and (len(ratios) < 2 or spent + last <= budget):
        off, on = step(False), step(True)
        spent, last = spent + off + on, off + on
        ratios.append(off / on)
        if len(ratios) == 2 and (min(ratios) >= clear or max(ratios) <= 1 / clear):
            break
    return ratios


def timed_step(toggle: Callable[[bool], str | None], state: bool, model: nn.Module,
               inputs: tuple, device: torch.device, prec: str) -> float:
    """Seconds (synchronised) for a forward and a backward of the mean of the first output, as
    the training step runs them, with the knob in ``state`` (in the precision the toggle returns,
    else ``prec``); the gradients are dropped."""
    precision = toggle(state) or prec
    synchronize(device)
    t0 = time.perf_counter()
    with autocast(precision, device):
        out = model(*inputs)
    loss = first_tensor(out).float().mean()
    if loss.requires_grad:
        loss.backward()
    model.zero_grad()
    synchronize(device)
    return time.perf_counter() - t0


@contextlib.contextmanager
def state_kept(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Weights, buffers, gradients and RNG streams put back after (gradients cleared during)."""
    state = copy.deepcopy(model.state_dict())  # its metadata too: BatchNorm's version
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    rng = rng_state(device)
    model.zero_grad()
    try:
        yield
    finally:
        model.load_state_dict(state)  # in place: the Parameters an optimizer holds stay
        for p, g in grads:
            p.grad = g
        set_rng_state(rng, device)


def can_cap_memory() -> bool:
    """Whether ``memory_cap`` can work here: Linux (its /proc), where POSIX ``resource`` is."""
    return bool(platform.proc())


@contextlib.contextmanager
def memory_cap() -> Iterator[None]:
    """Cap this process's address space at what it maps now plus the machine's available memory,
    for the duration: an allocation the machine could never satisfy (oneDNN's emulated bf16
    asking for hundreds of GB) fails as an error instead of the kernel killing the process."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + psutil.virtual_memory().available
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield  # already capped at least as tightly
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
