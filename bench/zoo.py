"""braindecode's model zoo for the challenge's input: which models build, and why the others do
not (shared by tests/train/test_isolate_models.py and bench/bench_zoo_isolate.py).

Every ``nn.Module`` class exported by ``braindecode.models`` is built with the challenge's input
(129 electrodes, 200 samples at 100 Hz, one output), passing only the arguments its constructor
takes (``TCN`` takes no ``n_times``); one forward pass on two windows must give one output per
window. A model that raises is left out with its error as the reason.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

CHALLENGE = {"n_chans": 129, "n_times": 200, "sfreq": 100, "n_outputs": 1}
SHAPE = (129, 200)
# left out without building: building them reaches the network
NOT_BUILT = {"REVE": "downloads its electrode position bank from huggingface.co when built"}


@dataclass
class Entry:
    """One zoo model: ``build()`` gives a fresh model seeded with 0, or ``reason`` says why it
    is left out; ``params`` and ``parametrized`` (how many parametrized modules) when built;
    ``too_large``: it builds but has more parameters than the run allows."""

    name: str
    build: Callable[[], nn.Module] | None = None
    reason: str = ""
    params: int = 0
    parametrized: int = 0
    too_large: bool = False


def _kwargs(cls: type) -> dict:
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return dict(CHALLENGE)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(CHALLENGE)
    return {k: v for k, v in CHALLENGE.items() if k in params}


def classes() -> list[tuple[str, type]]:
    """(name, class) of every model class ``braindecode.models`` exports, by name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import braindecode.models as bm
    return sorted((n, c) for n in dir(bm) if inspect.isclass(c := getattr(bm, n))
                  and issubclass(c, nn.Module))


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def entry(name: str, cls: type, max_params: int | None = None) -> Entry:
    """Build ``cls`` once for the challenge's input (see the module docstring). A model of more
    than ``max_params`` parameters is counted (on the meta device when it builds there: no
    memory, no time) and left out without running it."""
    from torch.nn.utils import parametrize

    if name in NOT_BUILT:
        return Entry(name, reason=NOT_BUILT[name])
    kwargs = _kwargs(cls)

    def build() -> nn.Module:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**kwargs)

    def too_large(params: int) -> Entry:
        return Entry(name, params=params, too_large=True,
                     reason=f"{params / 1e6:.1f} M parameters: more than this run's "
                            f"{max_params / 1e6:.1f} M")

    if max_params is not None:
        try:
            with torch.device("meta"):
                params = _params(build())
        except Exception:  # noqa: BLE001 - it builds on a real device, or fails there too
            params = 0
        if params > max_params:
            return too_large(params)
    try:
        model = build()
        if max_params is not None and _params(model) > max_params:
            return too_large(_params(model))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.eval()(torch.zeros(2, *SHAPE))
    except Exception as exc:  # noqa: BLE001 - any failure to build is the reason
        return Entry(name, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, 1):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Entry(name, reason=f"its output for 2 windows is {shape}, not (2, 1)")
    return Entry(name, build, params=_params(model),
                 parametrized=sum(map(parametrize.is_parametrized, model.modules())))


def zoo(max_params: int | None = None) -> list[Entry]:
    """Every exported model class, built or with the reason it is left out (``max_params``:
    see ``entry``)."""
    return [entry(name, cls, max_params) for name, cls in classes()]
