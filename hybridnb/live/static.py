"""Plotly figures that stay interactive and also carry a static image for exports.

A notebook output that holds only ``application/vnd.plotly.v1+json`` is dropped by
``nbconvert --to html`` and by a code host's preview. Here a plotly figure is translated to
matplotlib (a declared dependency; no browser, no network, no pyplot state touched) and its
image travels *in the same output* as the plotly JSON:

* ``static_figures()`` (``hn.static_figures()``): registers the ``"hybridnb_image"`` renderer
  and adds it to ``plotly.io.renderers.default``, so every figure shown in this kernel (a cell
  ending in ``fig``, ``fig.show()``) carries ``image/svg+xml`` too. Importing hybridnb changes
  no plotly setting; only this call does.
* ``StaticFigure``: a ``go.Figure`` that carries the image whatever the renderer settings; the
  library's own figures (``LRFindResult.plot()``) are these.
* ``to_svg(fig)`` / ``to_png(fig)`` / ``write_png(fig, path)``: the image itself
  (``trainer.report()``'s PNG); ``to_matplotlib(fig)``: the matplotlib Figure it is drawn from.

Why SVG and not PNG beside the JSON: JupyterLab's plotly renderer (jupyterlab-plotly, also in
Notebook 7) shows an output's ``image/png`` when there is one and draws the interactive plot
only once the mouse enters it; it ignores ``image/svg+xml``, so the figure is drawn by plotly at
once. Every frontend picks the richest type it knows from the one output: JupyterLab, Notebook 7
and VS Code the plotly JSON (interactive), Colab plotly's own ``text/html`` (its default
renderer there), ``nbconvert --to html``, nbviewer and GitHub the SVG (nbconvert's
``display_data_priority`` ranks it above PNG and draws it as an ``<img>``).

kaleido would draw the same figures pixel for pixel but needs a Chrome, which Colab and many
offline machines lack. What the translation draws, and what it leaves out (saying so in the
image): ``live/plotly_mpl.py``.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IMAGE_RENDERER = "hybridnb_image"
IMAGE_MIME = "image/svg+xml"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# the same figure gives the same bytes: no date, ids from a fixed salt (a re-run notebook's
# outputs do not change for nothing)
_SVG_RC = {"svg.hashsalt": "hybridnb", "svg.fonttype": "path"}


# ------------------------------------------------------------------ public API


def to_matplotlib(fig: Any):
    """The figure (a plotly figure or its dict) drawn as a ``matplotlib.figure.Figure`` (made
    without pyplot: a notebook's matplotlib backend and open figures are left alone)."""
    from hybridnb.live.plotly_mpl import draw

    return draw(fig if isinstance(fig, dict) else fig.to_dict())


def _save(fig: Any, fmt: str, **kwargs) -> bytes:
    import matplotlib

    from hybridnb.live.plotly_mpl import DPI, RC

    buf = io.BytesIO()
    with matplotlib.rc_context({**RC, **_SVG_RC}):  # tick labels are made while saving
        to_matplotlib(fig).savefig(buf, format=fmt, dpi=DPI, bbox_inches="tight",
                                   facecolor="white", **kwargs)
    return buf.getvalue()


def to_png(fig: Any) -> bytes:
    """The figure (a plotly figure or its dict) as PNG bytes, drawn with matplotlib."""
    return _save(fig, "png")


def to_svg(fig: Any) -> str:
    """The figure (a plotly figure or its dict) as an SVG document, drawn with matplotlib."""
    return _save(fig, "svg", metadata={"Date": None}).decode("utf-8")


def write_png(fig: Any, path: str | Path) -> Path:
    """Write ``to_png(fig)`` to ``path``; returns the path."""
    path = Path(path)
    path.write_bytes(to_png(fig))
    return path


def image_bundle(fig: Any) -> dict[str, str]:
    """``{"image/svg+xml": svg}``: the static image as a display mimebundle entry; ``{}`` with a
    warning when it cannot be drawn, so the figure's interactive output is still shown."""
    try:
        return {IMAGE_MIME: to_svg(fig)}
    except Exception as exc:
        warnings.warn(f"hybridnb could not draw a static image of this plotly figure "
                      f"({type(exc).__name__}: {exc}); it is shown interactively only, so an "
                      "exported or previewed notebook will not show it", stacklevel=2)
        return {}


def static_figures(enable: bool = True) -> str:
    """Keep every plotly figure shown from now on in this kernel interactive *and* give it a
    static image in the same output, for saved and exported notebooks (``enable=False``
    undoes it); returns plotly's new default renderer.

    Adds the ``"hybridnb_image"`` renderer to ``plotly.io.renderers.default`` (e.g.
    ``"plotly_mimetype"`` becomes ``"plotly_mimetype+hybridnb_image"``): the frontend shows
    the richest type it knows. Where plotly's default shows figures outside the notebook
    (``"browser"`` in a plain script) there is no output to add an image to, and the default
    is left as it was.
    """
    import plotly.io as pio

    register()
    names = [n for n in (pio.renderers.default or "").split("+") if n and n != IMAGE_RENDERER]
    if enable and _has_mimetype_renderer(names):
        names.append(IMAGE_RENDERER)
    pio.renderers.default = "+".join(names)
    return pio.renderers.default


def with_image(renderer: str | None) -> str | None:
    """``renderer`` (plotly's renderer string; None: the default) with the image renderer added
    when it makes a notebook output; unchanged when it only opens a browser or is empty."""
    import plotly.io as pio

    register()
    renderer = pio.renderers.default if renderer is None else renderer
    names = [n for n in (renderer or "").split("+") if n]
    if IMAGE_RENDERER in names or not _has_mimetype_renderer(names):
        return renderer
    return "+".join([*names, IMAGE_RENDERER])


def register() -> None:
    """Register the ``"hybridnb_image"`` renderer with plotly (the default is not changed)."""
    import plotly.io as pio

    if IMAGE_RENDERER not in pio.renderers:
        pio.renderers[IMAGE_RENDERER] = _renderer_class()()


def _has_mimetype_renderer(names: Sequence[str]) -> bool:
    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    return any(n in pio.renderers and isinstance(pio.renderers[n], MimetypeRenderer)
               and n != IMAGE_RENDERER for n in names)


_RENDERER_CLASS = None


def _renderer_class():
    """plotly's MimetypeRenderer subclass that emits the image (built on first use: plotly is
    imported only when a figure is made)."""
    global _RENDERER_CLASS
    if _RENDERER_CLASS is None:
        from plotly.io.base_renderers import MimetypeRenderer

        class StaticImageRenderer(MimetypeRenderer):
            """``image/svg+xml`` drawn with matplotlib (hybridnb.live.static): no kaleido, no
            browser. Combine it with an interactive renderer:
            ``"plotly_mimetype+hybridnb_image"``."""

            def to_mimebundle(self, fig_dict):
                return image_bundle(fig_dict)

        _RENDERER_CLASS = StaticImageRenderer
    return _RENDERER_CLASS


_FIGURE_CLASS = None


def static_figure(fig: Any):
    """``fig`` as a ``StaticFigure``: a plotly ``go.Figure`` that carries the image in every
    notebook output it makes (shown at a cell's end, ``.show()``, ``display()``), whether or not
    ``static_figures()`` was called."""
    return figure_class()(fig)


def figure_class():
    """The ``StaticFigure`` class (a ``plotly.graph_objects.Figure`` subclass)."""
    global _FIGURE_CLASS
    if _FIGURE_CLASS is None:
        import plotly.graph_objects as go
        import plotly.io as pio

        class StaticFigure(go.Figure):
            """A plotly figure whose notebook outputs also hold an image (hybridnb.live.static)."""

            def _repr_mimebundle_(self, include=None, exclude=None, validate=True, **kwargs):
                bundle = super()._repr_mimebundle_(include, exclude, validate, **kwargs)
                if bundle and not any(k.startswith("image/") for k in bundle):
                    bundle.update(image_bundle(self))
                return bundle

            def _ipython_display_(self):
                if pio.renderers.render_on_display and pio.renderers.default:
                    self.show()
                else:
                    print(repr(self))

            def show(self, *args, **kwargs):
                renderer = kwargs.pop("renderer", args[0] if args else None)
                validate = kwargs.pop("validate", args[1] if len(args) > 1 else True)
                pio.show(self, renderer=with_image(renderer), validate=validate, **kwargs)

        StaticFigure.__module__ = __name__
        StaticFigure.__qualname__ = "StaticFigure"
        _FIGURE_CLASS = StaticFigure
    return _FIGURE_CLASS


def __getattr__(name: str):
    if name == "StaticFigure":  # pickling and isinstance checks find the class by this name
        return figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
