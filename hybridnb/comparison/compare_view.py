"""How a compare() table is shown: a notebook table with a bar chart, or plain text."""

from __future__ import annotations

import functools

import pandas as pd

from hybridnb.env import NOTEBOOK_FRONTENDS, frontend

COLUMNS = [
    "variant", "precision", "compile", "batch_size", "status",
    "samples_per_s", "samples_per_s_min", "samples_per_s_max", "speedup", "step_ms",
    "peak_mem_mb", "compile_s", "final_loss", "loss_rel_diff", "loss_ok", "gpu_busy_pct", "note",
]
YTITLE = "samples/s (median; whiskers min–max)"


class CompareResult(pd.DataFrame):
    """The comparison table: a pandas DataFrame that, displayed in a notebook, also draws the bar
    chart. Derived frames (``df[cols]``, ``df.query(...)``) are plain DataFrames."""

    @property
    def _constructor(self):
        return pd.DataFrame

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(_display_frame(self))
        if frontend() in NOTEBOOK_FRONTENDS:
            display(compare_figure(self))
        for line in _footer(self):
            print(line)


def _cell(value, fmt: str) -> str:
    return "–" if pd.isna(value) else fmt.format(value)


def _display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The table as people read it: formatted text, notes as numbered footnotes."""
    multi = df["batch_size"].nunique() > 1
    out = []
    for i, row in enumerate(df.to_dict("records")):
        spread = ("–" if row["status"] != "ok" else
                  f"{row['samples_per_s_min']:.4g}–{row['samples_per_s_max']:.4g}")
        out.append({
            "variant": row["variant"], **({"batch": row["batch_size"]} if multi else {}),
            "status": row["status"],
            "samples/s": _cell(row["samples_per_s"], "{:.4g}"), "spread": spread,
            "speed-up": _cell(row["speedup"], "{:.2f}×"),
            "step ms": _cell(row["step_ms"], "{:.4g}"),
            "peak MiB": _cell(row["peak_mem_mb"], "{:.4g}"),
            "compile s": _cell(row["compile_s"], "{:.1f}"),
            "loss Δ vs fp32": _cell(row["loss_rel_diff"], "{:.1e}"),
            "note": f"[{i + 1}]" if row["note"] else "",
        })
    return pd.DataFrame(out)


def _footer(df: pd.DataFrame) -> list[str]:
    lines = [f"[{i + 1}] {row['variant']}"
             f"{' @' + str(row['batch_size']) if df['batch_size'].nunique() > 1 else ''}: "
             f"{row['note']}" for i, row in enumerate(df.to_dict("records")) if row["note"]]
    a = df.attrs
    if a:
        lines.append(f"{a.get('model', 'model')} on {a.get('device')}: {a.get('warmup')} warm-up "
                     f"+ 1 memory step, then {a.get('repeats')} interleaved windows of "
                     f"{a.get('steps')} steps; speed-up = median per-window ratio to fp32 eager.")
        lines.append(f"memory: this variant's weights, optimizer state and batch + the step's "
                     f"peak working memory ({a.get('memory_method')}).")
        if (df["compile"] != "eager").any():
            lines.append("compiled variants draw dropout masks from torch's generator like eager "
                         "(inductor fallback_random), so their loss compares with fp32.")
        lines.extend(a.get("notes", ()))
    return lines


def compare_table(df: pd.DataFrame) -> str:
    """The comparison as plain text (terminal, logs): the table, then the notes."""
    return "\n".join([_display_frame(df).to_string(index=False), *_footer(df)])


def _bars(df: pd.DataFrame):
    """Per batch size: its rows, bar heights (median samples/s; 0 unless ok), labels (speed-up or
    status), whiskers below and above (to the windows' min and max): for both drawings."""
    for bs, part in df.groupby("batch_size", sort=False):
        ok = part["status"] == "ok"
        y = part["samples_per_s"].where(ok, 0.0).fillna(0.0)
        text = [f"{s:.2f}×" if good and pd.notna(s) else status
                for s, good, status in zip(part["speedup"], ok, part["status"], strict=True)]
        yield (bs, part, y, text, (y - part["samples_per_s_min"]).where(ok, 0.0).fillna(0.0),
               (part["samples_per_s_max"] - y).where(ok, 0.0).fillna(0.0))


def compare_figure(df: pd.DataFrame):
    """A plotly bar chart: median samples/s per variant (whiskers: min–max over windows),
    labelled with the speed-up; skipped / failed / OOM variants appear with their status."""
    import plotly.graph_objects as go

    from hybridnb.live.static import static_figure

    where = f"{df.attrs.get('model', 'model')} on {df.attrs.get('device', '?')}"
    title = f"Training throughput by variant — {where}"
    fig = static_figure(go.Figure(), functools.partial(_image, df, title))
    for bs, part, y, text, below, above in _bars(df):
        fig.add_bar(
            x=part["variant"], y=y, name=f"batch {bs}", text=text, textposition="outside",
            hovertext=part["note"].where(part["note"] != "", part["status"]),
            error_y=dict(type="data", symmetric=False, array=above, arrayminus=below))
    fig.update_layout(
        title=title, barmode="group", yaxis_title=YTITLE, xaxis_title="variant",
        showlegend=df["batch_size"].nunique() > 1, template="plotly_white", height=420)
    return fig


def _image(df: pd.DataFrame, title: str):
    """``compare_figure``'s static image, drawn from the table with matplotlib (no pyplot)."""
    from matplotlib.figure import Figure

    groups, variants = list(_bars(df)), list(dict.fromkeys(df["variant"]))
    ax = Figure(figsize=(7, 4.2)).add_subplot(title=title, xlabel="variant", ylabel=YTITLE)
    width = 0.8 / len(groups)  # grouped side by side, as plotly's barmode="group"
    for k, (bs, part, y, text, below, above) in enumerate(groups):
        x = [variants.index(v) - 0.4 + (k + 0.5) * width for v in part["variant"]]
        ax.bar_label(ax.bar(x, y, width, yerr=[below, above], label=f"batch {bs}"), text,
                     fontsize=7)
    ax.set_xticks(range(len(variants)), variants)
    if len(groups) > 1:
        ax.legend(frameon=False, fontsize=8)
    return ax.figure
