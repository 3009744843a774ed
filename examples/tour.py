"""The README's short tour, runnable: detect the hardware, write a small synthetic release, train
a Challenge 1 model and score it on subjects it never saw.

    python examples/tour.py            # seed 0
    python examples/tour.py --seed 3

The code between the ``tour: begin`` / ``tour: end`` markers is what the README quotes (a test
checks that they match, and runs this script). Every run trains into a fresh
``runs/tour-<time>/`` folder, so an earlier run's checkpoints are never overwritten.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import torch
from braindecode.models import ShallowFBCSPNet

import hybridnb as hn
from data_prep import challenge1, scoring, source, splits


def main(seed: int = 0, cache: str | None = None, runs: str = "runs") -> float:
    """The tour; returns the test nRMSE."""
    # tour: begin
    hw = hn.detect()                 # cached; hn.detect(refresh=True, probe_timeout=15) re-probes
    print(hw)                        # device, precision, batch size, loader settings, and why

    root = source.resolve("synthetic", synthetic_kind="tour", cache=cache)  # written once, reused
    w1 = challenge1.make_windows(root)            # .X (N, 129, 200) float32 memmap, .y, .metadata
    train, val, test = splits.by_subject(w1, val=0.1, test=0.2, seed=0)

    torch.manual_seed(seed)                       # the model's initial weights
    model = ShallowFBCSPNet(n_chans=129, n_outputs=1, n_times=200, final_conv_length="auto",
                            n_filters_time=20, n_filters_spat=20)
    head = model.final_layer.conv_classifier      # start from predicting the mean response time
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(float(train.y.mean()))
    run = Path(runs) / f"tour-{dt.datetime.now():%Y%m%d-%H%M%S-%f}"   # fresh: overwrites nothing
    trainer = hn.Trainer(model, loss="huber", lr=3e-3, epochs=6, batch_size=32, seed=seed,
                         checkpoint_dir=run)
    trainer.fit(train.dataset(scale=1e6), val.dataset(scale=1e6))   # volts -> µV; live view
    pred = trainer.predict(test.dataset(scale=1e6))
    c1 = scoring.nrmse(test.y, pred)              # the challenge's score: 1.0 = predicting the mean
    print(f"test nRMSE {c1:.3f} on {len(test)} windows of unseen subjects; checkpoints in {run}")
    # tour: end
    return c1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seeds the model's initial weights "
                        "and the Trainer (default 0)")
    parser.add_argument("--cache", default=None, help="the cache the synthetic release goes to "
                        "(default: $HYBRIDNB_CACHE_DIR, else ~/.cache/hybridnb)")
    parser.add_argument("--runs", default="runs", help="parent of the run's fresh folder")
    args = parser.parse_args()
    main(args.seed, args.cache, args.runs)
