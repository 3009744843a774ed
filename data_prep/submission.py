"""The challenge submission: a zip the organisers' harness can load, and a check that loads it
the same way, in a fresh process, before anyone uploads it.

The harness (startkit ``submission.py``, see the reference notes) unpacks a single-level zip with
``submission.py``, ``weights_challenge_1.pt`` and ``weights_challenge_2.pt``, calls
``Submission(SFREQ, DEVICE)``, then ``get_model_challenge_1()`` / ``get_model_challenge_2()``, puts
each model in ``eval()`` mode and feeds ``float32 (B, 129, 200)`` batches under
``torch.inference_mode()``; the outputs must be ``(B, 1)``. Only torch and braindecode are there.

So a model is described by a :class:`ModelSpec` (a braindecode class name and its keyword
arguments) plus a state dict; the generated ``submission.py`` rebuilds it from those two alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SFREQ = 100
N_CHANS = 129
N_TIMES = 200
SUBMISSION_FILES = ("submission.py", "weights_challenge_1.pt", "weights_challenge_2.pt")


@dataclass(frozen=True)
class ModelSpec:
    """A braindecode model by class name and constructor arguments (JSON-able values only), so
    the same architecture can be rebuilt where only torch + braindecode exist.

    ``input_scale``: the factor the model's inputs were multiplied by in training (e.g. 1e6 when
    it learnt on microvolts, ``windows.dataset(scale=1e6)``). The harness feeds volts, so the
    generated ``submission.py`` multiplies by it before calling the model.
    """

    name: str
    kwargs: dict = field(default_factory=dict)
    input_scale: float = 1.0

    def __post_init__(self) -> None:
        try:
            json.dumps(self.kwargs)
        except TypeError as exc:
            raise ValueError(f"ModelSpec({self.name!r}) kwargs must be JSON-able values "
                             f"(numbers, strings, lists): {exc}") from None

    def build(self):
        """A fresh, untrained instance of the model."""
        from braindecode import models

        cls = getattr(models, self.name, None)
        if cls is None:
            raise ValueError(f"braindecode.models has no model named {self.name!r}")
        return cls(**self.kwargs)

    def to_dict(self) -> dict:
        return {"name": self.name, "kwargs": dict(self.kwargs),
                "input_scale": float(self.input_scale)}

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        return cls(d["name"], dict(d.get("kwargs", {})), float(d.get("input_scale", 1.0)))


def challenge_spec(name: str, input_scale: float = 1.0, **kwargs) -> ModelSpec:
    """The spec of a challenge model: 129 channels, 200 samples at 100 Hz, one output
    (``kwargs`` add to or override these constructor arguments)."""
    base = {"n_chans": N_CHANS, "n_outputs": 1, "n_times": N_TIMES, "sfreq": SFREQ}
    return ModelSpec(name, {**base, **kwargs}, float(input_scale))


# --------------------------------------------------------------------------------------------
# Saving one model (spec + weights) so another notebook can pick it up
# --------------------------------------------------------------------------------------------

def _state_dict(model) -> dict:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def save_model(path: str | os.PathLike, spec: ModelSpec, model) -> Path:
    """Write ``model``'s weights and its spec to ``path`` (a torch file holding only tensors and
    plain values, so it loads with ``weights_only=True``). Atomic: temp file + rename."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"spec": spec.to_dict(), "state_dict": _state_dict(model)}, tmp)
    os.replace(tmp, path)
    return path


def load_model(path: str | os.PathLike, map_location: str = "cpu"):
    """Rebuild a model written by :func:`save_model`. Returns ``(spec, model)``."""
    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no saved model at {path}")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
        spec = ModelSpec.from_dict(blob["spec"])
        state = blob["state_dict"]
    except (KeyError, TypeError, RuntimeError, EOFError) as exc:
        raise ValueError(f"{path} is not a model saved by data_prep.submission.save_model "
                         f"({type(exc).__name__}: {exc})") from exc
    model = spec.build()
    model.load_state_dict(state)
    return spec, model


# --------------------------------------------------------------------------------------------
# The zip
# --------------------------------------------------------------------------------------------

_TEMPLATE = '''\
"""EEG 2025 challenge submission (written by data_prep.submission from hybridnb).

Challenge 1 (response time) and Challenge 2 (externalizing): braindecode models rebuilt from
their class name and arguments, weights loaded from the files next to this one.
Needs only torch and braindecode.
"""

from pathlib import Path

import torch
from braindecode import models as _models

_HERE = Path(__file__).resolve().parent
# challenge -> (braindecode model, constructor arguments, weight file, input scale)
_MODELS = {
    1: (%(name1)r, %(kwargs1)r, "weights_challenge_1.pt", %(scale1)r),
    2: (%(name2)r, %(kwargs2)r, "weights_challenge_2.pt", %(scale2)r),
}


class _InputScale(torch.nn.Module):
    """The models learnt on inputs multiplied by ``factor`` (e.g. volts -> microvolts)."""

    def __init__(self, model, factor):
        super().__init__()
        self.model = model
        self.factor = factor

    def forward(self, x):
        return self.model(x * self.factor)


def _resolve_path(name):
    """The weights sit next to this file; Codabench has also used /app/output and /app/input/res."""
    for folder in (_HERE, Path("/app/output"), Path("/app/input/res"), Path.cwd()):
        candidate = folder / name
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{name} not found next to {__file__} nor in /app/output, /app/input/res")


class Submission:
    def __init__(self, SFREQ, DEVICE):
        if int(SFREQ) != %(sfreq)d:
            raise ValueError(f"these models were trained at %(sfreq)d Hz, not SFREQ={SFREQ}")
        self.sfreq = SFREQ
        self.device = torch.device(DEVICE)

    def _load(self, challenge):
        name, kwargs, weights, factor = _MODELS[challenge]
        model = getattr(_models, name)(**kwargs)
        state = torch.load(_resolve_path(weights), map_location=self.device, weights_only=True)
        model.load_state_dict(state)
        if factor != 1.0:
            model = _InputScale(model, factor)
        return model.to(self.device).eval()

    def get_model_challenge_1(self):
        return self._load(1)

    def get_model_challenge_2(self):
        return self._load(2)
'''


def submission_source(spec1: ModelSpec, spec2: ModelSpec, sfreq: int = SFREQ) -> str:
    """The text of ``submission.py`` for these two models."""
    return _TEMPLATE % {"name1": spec1.name, "kwargs1": dict(spec1.kwargs),
                        "scale1": float(spec1.input_scale), "name2": spec2.name,
                        "kwargs2": dict(spec2.kwargs), "scale2": float(spec2.input_scale),
                        "sfreq": int(sfreq)}


def build_submission(path: str | os.PathLike, challenge1: tuple, challenge2: tuple,
                     sfreq: int = SFREQ) -> Path:
    """Write the submission zip at ``path`` from ``(spec, model)`` pairs for both challenges.

    Each model's weights are checked against a fresh build of its spec first (a mismatch is
    named here, not on the organisers' machine). The zip is single-level, as the harness wants.
    """
    import io

    import torch

    path = Path(path)
    blobs = {}
    for challenge, (spec, model) in ((1, challenge1), (2, challenge2)):
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"challenge {challenge}: expected (ModelSpec, model), got "
                            f"{type(spec).__name__} as the spec")
        state = _state_dict(model)
        try:
            spec.build().load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(f"challenge {challenge}: the weights of {type(model).__name__} do "
                             f"not fit {spec.name}(**{spec.kwargs}): {exc}") from exc
        buf = io.BytesIO()
        torch.save(state, buf)
        blobs[f"weights_challenge_{challenge}.pt"] = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("submission.py", submission_source(challenge1[0], challenge2[0], sfreq))
        for name, data in blobs.items():
            zf.writestr(name, data)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------------
# The check: load it as the harness would, in a fresh interpreter
# --------------------------------------------------------------------------------------------

# Runs in a fresh `python -I` inside the unpacked submission folder. hybridnb and data_prep are
# blocked so that a submission leaning on them fails here rather than on the organisers' machine.
_CHECK = r'''
import importlib.abc, json, sys, time
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hybridnb", "data_prep"):
            raise ImportError(f"{name} is not available where submissions run")
        return None
sys.meta_path.insert(0, _Block())
sys.path.insert(0, ".")
import numpy as np
import torch
import braindecode
t0 = time.perf_counter()
from submission import Submission
challenge, batch_size = int(sys.argv[1]), int(sys.argv[2])
X = np.load("X.npy", mmap_mode="r")
y = np.load("y.npy")
sub = Submission(100, torch.device("cpu"))
model = getattr(sub, f"get_model_challenge_{challenge}")()
model.eval()
outs, shapes = [], set()
with torch.inference_mode():
    for i in range(0, len(X), batch_size):
        xb = torch.from_numpy(np.ascontiguousarray(X[i:i + batch_size], dtype=np.float32))
        out = model(xb)
        if tuple(out.shape) != (xb.shape[0], 1):
            raise SystemExit(f"challenge {challenge}: model returned shape {tuple(out.shape)} "
                             f"for a batch of shape {tuple(xb.shape)}; expected ({xb.shape[0]}, 1)")
        shapes.add(tuple(out.shape))
        outs.append(out.float().numpy())
pred = np.concatenate(outs)[:, 0]
rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
std = float(np.std(y))
print("RESULT " + json.dumps({
    "output_shape": [int(len(pred)), 1],
    "batch_shapes": sorted(list(s) for s in shapes),
    "nrmse": rmse / std if std > 0 else None,
    "rmse": rmse,
    "n": int(len(y)),
    "seconds": time.perf_counter() - t0,
    "torch": torch.__version__,
    "braindecode": braindecode.__version__,
    "leaked": sorted(m for m in sys.modules if m.split(".")[0] in ("hybridnb", "data_prep")),
}))
'''


class SubmissionError(RuntimeError):
    """The submission did not load or run the way the harness runs it."""


def check_submission(zip_path: str | os.PathLike, X, y, challenge: int = 1,
                     batch_size: int = 128, timeout: float = 600.0) -> dict:
    """Load the zip in a fresh Python process (only torch + braindecode; hybridnb and data_prep
    blocked), run challenge ``challenge``'s model on ``X`` ``(N, 129, 200)`` in batches, and
    score it against ``y``.

    Returns a dict: ``output_shape`` ``(N, 1)``, ``batch_shapes``, ``nrmse``, ``rmse``, ``n``,
    ``seconds``, library versions (``nrmse`` is None when every target is the same, e.g. one
    subject's Challenge 2 windows). Raises :class:`SubmissionError` with the child's message when
    the zip is incomplete or the model fails or returns the wrong shape.
    """
    zip_path = Path(zip_path)
    if challenge not in (1, 2):
        raise ValueError(f"challenge must be 1 or 2, got {challenge!r}")
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if X.ndim != 3 or X.shape[1:] != (N_CHANS, N_TIMES):
        raise ValueError(f"X must be (N, {N_CHANS}, {N_TIMES}) windows, got shape {X.shape}")
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} windows but y has {len(y)} targets")
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        missing = [n for n in SUBMISSION_FILES if n not in names]
        if missing:
            raise SubmissionError(f"{zip_path} lacks {', '.join(missing)} (it holds {names}); "
                                  "the harness expects them at the top level of the zip")
        with tempfile.TemporaryDirectory(prefix="hybridnb-submission-") as tmp:
            zf.extractall(tmp)
            np.save(Path(tmp) / "X.npy", X)
            np.save(Path(tmp) / "y.npy", y)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            env.setdefault("OMP_NUM_THREADS", "1")
            proc = subprocess.run(
                [sys.executable, "-I", "-W", "ignore", "-c", _CHECK, str(challenge),
                 str(batch_size)], cwd=tmp, env=env, capture_output=True, text=True,
                timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SubmissionError(f"{zip_path}: challenge {challenge} failed in a fresh process "
                              f"(exit {proc.returncode}): {tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["output_shape"] = tuple(result["output_shape"])
    result["batch_shapes"] = [tuple(s) for s in result["batch_shapes"]]
    result["challenge"] = challenge
    return result

