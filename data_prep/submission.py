"""The challenge submission: a zip the organisers' harness can load, and a check that loads it
the same way, in a fresh process, before anyone uploads it.

The harness (startkit ``submission.py``, see the reference notes) unpacks a single-level zip with
``submission.py``, ``weights_challenge_1.pt`` and ``weights_challenge_2.pt``, calls
``Submission(SFREQ, DEVICE)``, then ``get_model_challenge_1()`` / ``get_model_challenge_2()``, puts
each model in ``eval()`` mode and feeds ``float32 (B, 129, 200)`` batches under
``torch.inference_mode()``; the outputs must be ``(B, 1)``. Only torch and braindecode are there.

So a model is described by a :class:`ModelSpec` (a braindecode class name and its keyword
arguments) plus a state dict; the generated ``submission.py`` rebuilds it from those two alone.
That file is :mod:`data_prep.submission_template` with its ``TRAINED_SFREQ`` and ``MODELS`` lines
filled in; the check runs :mod:`data_prep.submission_check` in a fresh interpreter and scores its
predictions here with :func:`data_prep.scoring.nrmse`. Both are real modules, linted and tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import environment, scoring
from .submission_check import RESULT_PREFIX

if TYPE_CHECKING:
    import torch

SFREQ = 100
N_CHANS = 129
N_TIMES = 200
SUBMISSION_FILES = ("submission.py", "weights_challenge_1.pt", "weights_challenge_2.pt")


@dataclass(frozen=True)
class ModelSpec:
    """A braindecode model by class name and constructor arguments (JSON-able values only), so
    the same architecture can be rebuilt where only torch + braindecode exist. An argument that
    takes a layer type names it as a string, ``"torch.nn.<Name>"`` (``conv_nonlin="torch.nn.ELU"``):
    :meth:`build` and the generated ``submission.py`` pass the class itself.

    ``input_scale``: the factor the model's inputs were multiplied by in training (e.g. 1e6 when
    it learnt on microvolts, ``windows.dataset(scale=1e6)``). The harness feeds volts, so the
    generated ``submission.py`` multiplies by it before calling the model.

    ``members``: more than 1 for an ensemble, the mean output of that many independently
    trained models of this architecture (:func:`average`); the generated ``submission.py``
    rebuilds it with the same averaging module, torch + braindecode only.
    """

    name: str
    kwargs: dict = field(default_factory=dict)
    input_scale: float = 1.0
    members: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.members, int) and self.members >= 1):
            raise ValueError(f"ModelSpec({self.name!r}) members must be a whole number >= 1, "
                             f"got {self.members!r}")
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
        from .submission_template import Average, resolve_kwargs

        kwargs = resolve_kwargs(self.kwargs)
        if self.members == 1:
            return cls(**kwargs)
        return Average([cls(**kwargs) for _ in range(self.members)])

    def ensemble(self, members: int) -> ModelSpec:
        """This spec as an ensemble of ``members`` models (see :func:`average`)."""
        return ModelSpec(self.name, dict(self.kwargs), self.input_scale, int(members))

    def to_dict(self) -> dict:
        return {"name": self.name, "kwargs": dict(self.kwargs),
                "input_scale": float(self.input_scale), "members": self.members}

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        return cls(d["name"], dict(d.get("kwargs", {})), float(d.get("input_scale", 1.0)),
                   int(d.get("members", 1)))


def average(spec: ModelSpec, models) -> tuple[ModelSpec, torch.nn.Module]:
    """``(spec.ensemble(k), ensemble)`` for ``k`` trained models of ``spec``: one module whose
    output is the mean of theirs (the submission template's :class:`Average`, so the zip
    rebuilds the same thing). Averaging independently trained models steadies a noisy target:
    each member's seed-to-seed wobble partly cancels."""
    models = list(models)
    if not models:
        raise ValueError("average needs at least one trained model")
    if spec.members != 1:
        raise ValueError(f"average takes the spec of one member, got members={spec.members}")
    for i, m in enumerate(models):
        if type(m).__name__ != spec.name:
            raise ValueError(f"average: model {i} is a {type(m).__name__}, not a {spec.name} "
                             "(every member must be built from the spec)")
    from .submission_template import Average

    return spec.ensemble(len(models)), Average([m.eval() for m in models])


def challenge_spec(name: str, input_scale: float = 1.0, **kwargs) -> ModelSpec:
    """The spec of a challenge model: 129 channels, 200 samples at 100 Hz, one output
    (``kwargs`` add to or override these constructor arguments)."""
    base = {"n_chans": N_CHANS, "n_outputs": 1, "n_times": N_TIMES, "sfreq": SFREQ}
    return ModelSpec(name, {**base, **kwargs}, float(input_scale))


def _state_dict(model) -> dict:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------
# The zip
# --------------------------------------------------------------------------------------------

TEMPLATE = Path(__file__).with_name("submission_template.py")
CHECK_SCRIPT = Path(__file__).with_name("submission_check.py")


def submission_source(spec1: ModelSpec, spec2: ModelSpec, sfreq: int = SFREQ) -> str:
    """The text of ``submission.py`` for these two models: :data:`TEMPLATE` (a real module,
    linted and tested) with its ``TRAINED_SFREQ`` and ``MODELS`` lines filled in."""
    models = {c: (s.name, dict(s.kwargs), f"weights_challenge_{c}.pt", float(s.input_scale),
                  s.members) for c, s in ((1, spec1), (2, spec2))}
    lines = [f"    {c}: {v!r}," for c, v in models.items()]
    return _fill(TEMPLATE.read_text(encoding="utf-8"), {
        "TRAINED_SFREQ = 100": f"TRAINED_SFREQ = {int(sfreq)}",
        "MODELS = {}": "MODELS = {\n" + "\n".join(lines) + "\n}"})


def _fill(source: str, lines: dict[str, str]) -> str:
    """Replace each whole line ``old`` of ``source`` (which must occur exactly once) by ``new``."""
    out = source.splitlines()
    for old, new in lines.items():
        where = [i for i, ln in enumerate(out) if ln == old]
        if len(where) != 1:
            raise RuntimeError(f"{TEMPLATE} must hold the line {old!r} exactly once "
                               f"(found {len(where)}); it is filled in when the zip is written")
        out[where[0]] = new
    return "\n".join(out) + "\n"


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
            what = f"{spec.name}(**{spec.kwargs})" + (
                f" x members={spec.members}" if spec.members > 1 else "")
            raise ValueError(f"challenge {challenge}: the weights of {type(model).__name__} do "
                             f"not fit {what}: {exc}") from exc
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
    return check_submissions(zip_path, {challenge: (X, y)}, batch_size, timeout)[challenge]


def check_submissions(zip_path: str | os.PathLike, data: dict, batch_size: int = 128,
                      timeout: float = 600.0) -> dict[int, dict]:
    """:func:`check_submission` for several challenges, ``{challenge: (X, y)}`` -> ``{challenge:
    result}``: their fresh processes run at the same time (each on one thread), so checking both
    challenges waits for one interpreter start, not two."""
    zip_path = Path(zip_path)
    inputs = {}
    for challenge, (X, y) in data.items():
        if challenge not in (1, 2):
            raise ValueError(f"challenge must be 1 or 2, got {challenge!r}")
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if X.ndim != 3 or X.shape[1:] != (N_CHANS, N_TIMES):
            raise ValueError(f"challenge {challenge}: X must be (N, {N_CHANS}, {N_TIMES}) "
                             f"windows, got shape {X.shape}")
        if len(X) != len(y):
            raise ValueError(f"challenge {challenge}: X has {len(X)} windows but y has {len(y)} "
                             "targets")
        inputs[challenge] = X, y
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        missing = [n for n in SUBMISSION_FILES if n not in names]
        if missing:
            raise SubmissionError(f"{zip_path} lacks {', '.join(missing)} (it holds {names}); "
                                  "the harness expects them at the top level of the zip")
        with tempfile.TemporaryDirectory(prefix="hybridnb-submission-") as tmp:
            started = {}
            try:
                for challenge, (X, _) in inputs.items():
                    folder = Path(tmp) / str(challenge)
                    zf.extractall(folder)
                    started[challenge] = _start_check(folder, X, challenge, batch_size)
                deadline = time.monotonic() + timeout  # one clock: the checks run side by side
                finished = {c: _finish_check(proc, folder, deadline, timeout, zip_path)
                            for c, (proc, folder) in started.items()}
            finally:
                for proc, _ in started.values():
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
    return {c: _result(zip_path, c, *finished[c], inputs[c][1]) for c in inputs}


def _result(zip_path: Path, challenge: int, proc: subprocess.CompletedProcess,
            pred: np.ndarray | None, y: np.ndarray) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines or pred is None:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SubmissionError(f"{zip_path}: challenge {challenge} failed in a fresh process "
                              f"(exit {proc.returncode}): {tail}")
    bad = int(np.count_nonzero(~np.isfinite(pred)))
    if bad:
        raise SubmissionError(f"{zip_path}: challenge {challenge}'s model returned {bad} "
                              f"non-finite predictions (NaN/inf) for {len(pred)} windows")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result["output_shape"] = tuple(result["output_shape"])
    result["batch_shapes"] = [tuple(s) for s in result["batch_shapes"]]
    result["rmse"] = scoring.rmse(y, pred)
    result["nrmse"] = scoring.nrmse(y, pred) if np.std(y) > 0 else None
    result["challenge"] = challenge
    return result


def _start_check(folder: Path, X: np.ndarray, challenge: int,
                 batch_size: int) -> tuple[subprocess.Popen, Path]:
    """Start :data:`CHECK_SCRIPT` in ``folder`` (the unpacked zip) in a fresh ``python -I``."""
    np.save(folder / "X.npy", X)
    script = folder / "_harness_check.py"
    shutil.copyfile(CHECK_SCRIPT, script)
    env = environment.for_child("PYTHON")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen([sys.executable, "-I", "-W", "ignore", str(script), str(challenge),
                             str(batch_size)], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, folder


def _finish_check(proc: subprocess.Popen, folder: Path, deadline: float, timeout: float,
                  zip_path: Path) -> tuple[subprocess.CompletedProcess, np.ndarray | None]:
    """The finished process and its predictions (None when it wrote none); killed at
    ``deadline`` (``time.monotonic()``), ``timeout`` s after the checks started."""
    try:
        # one that already ended is read whatever the clock says (communicate(timeout=0)
        # raises TimeoutExpired even then)
        left = None if proc.poll() is not None else max(0.0, deadline - time.monotonic())
        out, err = proc.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SubmissionError(f"{zip_path}: challenge {folder.name}'s model did not finish "
                              f"within {timeout:.0f} s in a fresh process; pass a larger "
                              "timeout= on a slow machine") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    pred_path = folder / "pred.npy"
    return done, (np.load(pred_path).astype(np.float64) if pred_path.exists() else None)
