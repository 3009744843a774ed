"""EEG 2025 challenge submission (written by data_prep.submission from this template).

Challenge 1 (response time) and Challenge 2 (externalizing): braindecode models rebuilt from
their class name and arguments, weights loaded from the files next to this one.
Needs only torch and braindecode: the organisers' harness has nothing else.
"""

from pathlib import Path

import torch
from braindecode import models as _models

_HERE = Path(__file__).resolve().parent
# Replaced line by line when the zip is written (the lines must stay exactly as they are here).
TRAINED_SFREQ = 100
# challenge -> (braindecode model, constructor arguments, weight file, input scale, members)
MODELS = {}


MODULE_PREFIX = "torch.nn."


def resolve_kwargs(kwargs):
    """Constructor arguments with each ``"torch.nn.<Name>"`` string replaced by that class of
    ``torch.nn`` (e.g. ``conv_nonlin="torch.nn.ELU"``): how a spec written as plain data names
    a layer type such as a nonlinearity."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, str) and value.startswith(MODULE_PREFIX):
            cls = getattr(torch.nn, value[len(MODULE_PREFIX):], None)
            if not isinstance(cls, type):
                raise ValueError(f"argument {key}={value!r} names no class of torch.nn")
            value = cls
        out[key] = value
    return out


class Average(torch.nn.Module):
    """The mean output of several models of one architecture (an ensemble of independently
    trained members); its weights are the members' weights under ``members.<i>.``."""

    def __init__(self, members):
        super().__init__()
        self.members = torch.nn.ModuleList(members)

    def forward(self, x):
        return torch.stack([m(x) for m in self.members]).mean(dim=0)


class _InputScale(torch.nn.Module):
    """The models learnt on inputs multiplied by ``factor`` (e.g. volts -> microvolts)."""

    def __init__(self, model, factor):
        super().__init__()
        self.model = model
        self.factor = factor

    def forward(self, x):
        return self.model(x * self.factor)


# Where the weights are looked for: next to this file (the zip's own), then the starter kit's
# resolve_path order (/app/input/res, /app/input, the working folder), then /app/output, which
# Codabench has also used.
_SEARCH = (_HERE, Path("/app/input/res"), Path("/app/input"), Path("."), Path("/app/output"))


def _resolve_path(name):
    """The first of ``_SEARCH`` that holds ``name``."""
    for folder in _SEARCH:
        candidate = folder / name
        if candidate.exists():
            return candidate.resolve()
    raise FileNotFoundError(f"{name} not found in any of: " + ", ".join(
        str(f) if f != Path(".") else f"the working folder ({Path.cwd()})" for f in _SEARCH))


class Submission:
    """The harness's interface: ``Submission(SFREQ, DEVICE)``, then one model per challenge."""

    def __init__(self, SFREQ, DEVICE):
        if int(SFREQ) != TRAINED_SFREQ:
            raise ValueError(f"these models were trained at {TRAINED_SFREQ} Hz, not SFREQ={SFREQ}")
        self.sfreq = SFREQ
        self.device = torch.device(DEVICE)

    def _load(self, challenge):
        if challenge not in MODELS:
            raise KeyError(f"this submission holds no model for challenge {challenge}")
        name, kwargs, weights, factor, members = MODELS[challenge]
        cls = getattr(_models, name)
        kwargs = resolve_kwargs(kwargs)
        model = cls(**kwargs) if members == 1 else Average([cls(**kwargs) for _ in range(members)])
        state = torch.load(_resolve_path(weights), map_location=self.device, weights_only=True)
        model.load_state_dict(state)
        if factor != 1.0:
            model = _InputScale(model, factor)
        return model.to(self.device).eval()

    def get_model_challenge_1(self):
        return self._load(1)

    def get_model_challenge_2(self):
        return self._load(2)
