"""``trainer.report(folder)``: what a run leaves behind for people who were not watching (the
files: ``Trainer.report``), drawn from a ``RunRecord`` refilled with the run's rows and events."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from hybridnb.events import EpochRow, StepRow
from hybridnb.live import summary as live_summary
from hybridnb.live.record import RunRecord


def write_report(trainer, folder) -> Path:
    """Write the report files into ``folder`` (created); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = trainer.summary()
    trainer.history.to_csv(folder / "history.csv", index=False)
    trainer.steps.to_csv(folder / "steps.csv", index=False)
    events = pd.DataFrame([e.to_dict() for e in trainer.events],
                          columns=["kind", "message", "step", "epoch", "time"])
    events.to_csv(folder / "events.csv", index=False)
    import plotly.graph_objects as go  # only where a figure is drawn

    from hybridnb.live import figures, panel_image, static

    record = run_record(trainer, summary)
    fig = go.Figure(figures.figure_dict(record)).update_layout(template="plotly_white")
    fig.write_html(folder / "figures.html", include_plotlyjs=True)
    # the same panels drawn by matplotlib, not translated from plotly
    (folder / "figures.png").write_bytes(static.save(panel_image.draw(record), "png"))
    try:  # model.txt: output shapes when a forward on one zero sample works
        table, notes = trainer.model_summary(), []
    except Exception as exc:  # the user's forward: any error, said in the summary
        table = model_summary(trainer.model)
        notes = [f"model.txt holds parameters only: a forward on one zero sample failed "
                 f"({type(exc).__name__}: {str(exc)[:160]})"]
    (folder / "model.txt").write_text(f"{table}\n")
    # the live view's end paragraph, then each event and what the report left out
    lines = [live_summary.paragraph(summary, record), "",
             *[f"  {ev}" for ev in summary["events"]], *notes]
    (folder / "summary.txt").write_text("\n".join(lines) + "\n")
    return folder


def model_summary(model: torch.nn.Module, input_shape: Sequence[int] | None = None,
                  depth: int = 3):
    """torchinfo's ``ModelStatistics`` (``str()``: the table) for one zero-filled sample of
    ``input_shape`` (without the batch dimension; None: parameters only), in eval mode and
    without gradients, so asking for it never changes a run (no random numbers, no statistics)."""
    import torchinfo  # imported only when a summary is asked for

    weights = next(iter(model.parameters()), None)
    device = weights.device if weights is not None else torch.device("cpu")
    data = None
    if input_shape is not None:
        dtype = weights.dtype if weights is not None and weights.is_floating_point() else \
            torch.float32
        data = [torch.zeros((1, *input_shape), dtype=dtype, device=device)]
    with torch.no_grad():
        return torchinfo.summary(model, input_data=data, depth=depth, verbose=0, mode="eval",
                                 device=device, col_names=("output_size", "num_params")
                                 if data is not None else ("num_params",))


def run_record(trainer, summary: dict) -> RunRecord:
    """The live view's record of ``trainer``'s run, refilled from its steps, epoch rows and
    events (what a view that watched the whole run would hold, without memory samples)."""
    steps, hist = trainer.steps, trainer.history
    run = {"epochs": trainer.epochs, "steps_per_epoch": int(steps.groupby("epoch").size().max())
           if len(steps) else None, "device": summary["device"], "precision": summary["precision"],
           "model": type(trainer.model).__name__, "monitor": trainer.monitor,
           "n_params": sum(p.numel() for p in trainer.model.parameters())}
    events = list(trainer.events)
    record = RunRecord(run)
    if events:
        record.start_time = min(ev.time for ev in events)  # event times: seconds from here
    rows = hist.to_dict("records")
    in_epoch = (steps.groupby("epoch").cumcount() + 1).tolist() if len(steps) else []
    for (global_step, epoch, loss, lr), step in zip(steps.itertuples(index=False), in_epoch,
                                                    strict=True):
        record.add(StepRow(global_step=int(global_step), epoch=int(epoch), loss=loss, lr=lr,
                           step=step))
        while rows and rows[0]["step"] == global_step:  # the epoch ended at this step
            row = rows.pop(0)
            record.add(EpochRow(row, global_step=int(row["step"]), epoch_end=True))
    record.events.extend(events)
    return record
