"""Run an unpacked submission the way the organisers' harness does; the child process of
:func:`data_prep.submission.check_submission`.

``python -I submission_check.py CHALLENGE BATCH_SIZE``, started in the unpacked submission
folder, which also holds ``X.npy`` (the windows). It blocks ``hybridnb`` and ``data_prep`` (a
submission leaning on them must fail here, not on the organisers' machine), calls
``Submission(100, cpu)``, runs ``get_model_challenge_<CHALLENGE>()`` in ``eval()`` mode on
``float32 (B, 129, 200)`` batches under ``torch.inference_mode()``, refuses any output that is not
``(B, 1)``, writes the predictions to ``pred.npy`` and prints one ``RESULT {json}`` line.

It does not score: the parent scores ``pred.npy`` with :func:`data_prep.scoring.nrmse`, the one
nRMSE of this project, which this process may not import.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time

BLOCKED = ("hybridnb", "data_prep")
RESULT_PREFIX = "RESULT "


class BlockProject(importlib.abc.MetaPathFinder):
    """An import hook that refuses this project's packages, as the harness would."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not available where submissions run")
        return None


def run(challenge: int, batch_size: int) -> dict:
    """Load ``submission.py`` from the working folder and predict ``X.npy``; returns the report
    (shapes, seconds, library versions, project modules that leaked in)."""
    import braindecode
    import numpy as np
    import torch

    t0 = time.perf_counter()
    sys.path.insert(0, ".")
    from submission import Submission

    X = np.load("X.npy", mmap_mode="r")
    model = getattr(Submission(100, torch.device("cpu")), f"get_model_challenge_{challenge}")()
    model.eval()
    outs, shapes = [], set()
    with torch.inference_mode():
        for i in range(0, len(X), batch_size):
            xb = torch.from_numpy(np.ascontiguousarray(X[i:i + batch_size], dtype=np.float32))
            out = model(xb)
            if tuple(out.shape) != (xb.shape[0], 1):
                raise SystemExit(f"challenge {challenge}: model returned shape "
                                 f"{tuple(out.shape)} for a batch of shape {tuple(xb.shape)}; "
                                 f"expected ({xb.shape[0]}, 1)")
            shapes.add(tuple(out.shape))
            outs.append(out.float().numpy())
    pred = np.concatenate(outs)[:, 0] if outs else np.zeros(0, np.float32)
    np.save("pred.npy", pred)
    return {"output_shape": [len(pred), 1],
            "batch_shapes": sorted(list(s) for s in shapes),
            "n": len(pred),
            "seconds": time.perf_counter() - t0,
            "torch": torch.__version__,
            "braindecode": braindecode.__version__,
            "leaked": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}


def main(argv: list[str] | None = None) -> None:
    """Block the project, run the submission, print ``RESULT {json}``."""
    args = sys.argv[1:] if argv is None else argv
    sys.meta_path.insert(0, BlockProject())
    print(RESULT_PREFIX + json.dumps(run(int(args[0]), int(args[1]))))


if __name__ == "__main__":
    main()
