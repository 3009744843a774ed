"""The live view: ``make_view(live)`` (``"auto"`` | False | None | ``"widgets"`` | ``"html"`` |
``"text"``) gives the ``base.View`` the Trainer draws through. For ``"auto"`` the renderer is
chosen once, from ``hybridnb.env.frontend()``: widgets (ipywidgets bars + plotly FigureWidget,
needs anywidget) in a JupyterLab / Notebook 7 session, and on Colab with the ipywidgets 7 it
ships once its custom widget manager is on; html (display handles) in VS Code, unknown
frontends, or where widgets would not draw; text in terminals, CI and headless notebook runs
(nbclient, nbval, papermill). Every fallback is said once, in the view's header line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Mapping

from hybridnb.env import NOTEBOOK_FRONTENDS, current
from hybridnb.live.base import LiveView, View

__all__ = ["LIVE_CHOICES", "LiveView", "View", "choose_renderer", "make_view"]

LIVE_CHOICES = ("auto", "widgets", "html", "text")


def _widgets_missing() -> str:
    """What the widget view lacks, to install ('' when nothing)."""
    return " ".join(m for m in ("ipywidgets", "anywidget", "plotly")
                    if importlib.util.find_spec(m) is None)


def _ipywidgets_versions() -> tuple[str | None, str | None]:
    """(the ipywidgets this process has imported or None, the one installed on disk or None)."""
    loaded = getattr(sys.modules.get("ipywidgets"), "__version__", None)
    try:
        installed = importlib.metadata.version("ipywidgets")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    return loaded, installed


def _colab_widgets_blocker() -> str:
    """Why Colab would not draw the live view's widgets, else ''.

    Colab's custom widget manager draws third-party widgets (plotly's FigureWidget is one,
    through anywidget) with ipywidgets 7, which Colab ships; with ipywidgets 8 they stay blank.
    A runtime that imported one ipywidgets while pip installed another runs the old one until
    restarted, and its frontend gets messages it may not draw.
    """
    loaded, installed = _ipywidgets_versions()
    if loaded and installed and loaded != installed:
        return (f"this runtime loaded ipywidgets {loaded} but {installed} is installed now "
                f"(restart the runtime: Runtime > Restart session)")
    version = loaded or installed
    if version and not version.startswith("7."):
        return (f"Colab draws plotly's widget plots with ipywidgets 7 (what it ships), and "
                f"ipywidgets {version} is installed (pip install 'ipywidgets<8', then restart "
                f"the runtime)")
    return ""


def _enable_colab_widgets() -> str:
    """Turn on Colab's custom widget manager (third-party widgets); '' on success, else why."""
    try:
        from google.colab import output  # type: ignore[import-not-found]

        output.enable_custom_widget_manager()
        return ""
    except Exception as exc:  # broad: Colab's internals; the HTML fallback says why
        return f"Colab's custom widget manager could not be enabled ({type(exc).__name__})"


def choose_renderer(live: object = "auto", front: str | None = None,
                    environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Pick the renderer: returns ``(name, note)`` with name in none/widgets/html/text and a
    sentence when the choice is a fallback (else ``""``)."""
    if live is False or live is None:
        return "none", ""
    live = "auto" if live is True else live
    if not isinstance(live, str) or live not in LIVE_CHOICES:
        raise ValueError(f"live must be one of {LIVE_CHOICES} or False; got live={live!r}")
    if front is None:
        from hybridnb.env import frontend

        front = frontend()
    auto = live == "auto"
    if live == "text" or (auto and front not in NOTEBOOK_FRONTENDS):
        return "text", ""
    if front in ("terminal", "ipython"):  # asked for explicitly
        return "text", f"live={live!r} needs a notebook ({front}): showing text instead"
    if live == "html" or (auto and front == "vscode"):
        return "html", ""
    missing = _widgets_missing()
    if missing:
        return "html", (f"{'live widgets' if auto else 'widgets'} need {missing} "
                        f"(pip install {missing}): showing HTML")
    if front == "colab":
        why = (_colab_widgets_blocker() if auto else "") or _enable_colab_widgets()
        return ("html", f"{why}: showing HTML" + ("; live='widgets' forces widgets" if auto
                                                   else "")) if why else ("widgets", "")
    if auto and not (current() if environ is None else environ).get("JPY_SESSION_NAME"):
        return "html", ("not a JupyterLab/Notebook 7 session (unknown frontend): showing HTML; "
                        "pass live='widgets' to force widgets")
    return "widgets", ""


def make_view(live: object = "auto", **kwargs) -> View:
    """The live view for ``live`` (see module doc); ``False``/``None`` -> a no-op view."""
    name, note = choose_renderer(live)
    if name == "none":
        return View()
    module, cls = {"widgets": ("widgets", "WidgetView"), "html": ("html", "HtmlView"),
                   "text": ("console", "ConsoleView")}[name]  # imported only when chosen
    return getattr(importlib.import_module(f"hybridnb.live.{module}"), cls)(note, **kwargs)
