"""Plotly figures that stay interactive and also carry a static image for exports.

A notebook output holding only ``application/vnd.plotly.v1+json`` is dropped by ``nbconvert --to
html`` and by a code host's preview, so an SVG (drawn with matplotlib: no browser, no pyplot
state) travels in the same output: ``static_figures()`` adds the ``"hybridnb_image"`` renderer
to plotly's default (importing hybridnb changes no plotly setting); ``static_figure(fig)`` makes a
figure that carries the image whatever the settings. User figures are translated
(``live/plotly_mpl.py``); hybridnb's own are drawn from their data, not translated.
SVG, not PNG: JupyterLab's plotly renderer shows an ``image/png`` instead of drawing the plot;
it ignores ``image/svg+xml``. kaleido would draw user figures pixel for pixel but needs a
Chrome, which Colab and many offline machines lack.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

from hybridnb.live.plotly_mpl import DPI, RC  # plotly's sizes in matplotlib's units
from hybridnb.live.plotly_mpl import draw as translate

# every static image of hybridnb (its own panels and translated user figures)
IMAGE_RENDERER = "hybridnb_image"
IMAGE_MIME = "image/svg+xml"
# the same figure, the same bytes: a re-run notebook's outputs do not change for nothing
_SVG_RC = {"svg.hashsalt": "hybridnb", "svg.fonttype": "path"}


def save(figure: Any, fmt: str) -> bytes:
    """A matplotlib Figure as ``fmt`` ("svg" or "png") bytes, trimmed, on white; titled with
    the Figure's label when it has one."""
    import matplotlib

    meta = {"Date": None} if fmt == "svg" else {}  # no date: the same figure, the same bytes
    if figure.get_label():
        meta["Title"] = figure.get_label()
    buf = io.BytesIO()
    with matplotlib.rc_context({**RC, **_SVG_RC}):  # tick labels are made while saving
        figure.savefig(buf, format=fmt, dpi=DPI, bbox_inches="tight", facecolor="white",
                       metadata=meta)
    return buf.getvalue()


def to_png(fig: Any) -> bytes:
    """The figure (a plotly figure or its dict) as PNG bytes, drawn with matplotlib."""
    return save(translate(fig), "png")


def to_svg(fig: Any) -> str:
    """The figure (a plotly figure or its dict) as an SVG document, drawn with matplotlib."""
    return save(translate(fig), "svg").decode("utf-8")


def image_bundle(fig: Any, draw: Callable[[], Any] | None = None) -> dict[str, str]:
    """``{"image/svg+xml": svg}`` (drawn by ``draw``, else translated from ``fig``), or ``{}``
    with a warning: the interactive output still shows."""
    try:
        return {IMAGE_MIME: save(draw(), "svg").decode("utf-8") if draw else to_svg(fig)}
    except Exception as exc:  # broad: any drawing failure must leave the interactive output
        warnings.warn(f"hybridnb could not draw a static image of this plotly figure "
                      f"({type(exc).__name__}: {exc}); it is shown interactively only, so an "
                      "exported or previewed notebook will not show it", stacklevel=2)
        return {}


def static_figures(enable: bool = True) -> str:
    """Keep every plotly figure shown from now on in this kernel interactive *and* give it a
    static image in the same output (``enable=False`` undoes it); returns plotly's new default
    renderer (e.g. ``"plotly_mimetype+hybridnb_image"``). Where plotly's default shows figures
    outside the notebook (``"browser"`` in a plain script) it is left as it was."""
    names = [n for n in (pio.renderers.default or "").split("+") if n != IMAGE_RENDERER]
    pio.renderers.default = with_image("+".join(names)) if enable else "+".join(names)
    return pio.renderers.default


def with_image(renderer: str | None) -> str | None:
    """``renderer`` (plotly's renderer string; None: the default) with the image renderer added
    when it makes a notebook output; unchanged when it only opens a browser or is empty."""
    if IMAGE_RENDERER not in pio.renderers:
        pio.renderers[IMAGE_RENDERER] = StaticImageRenderer()
    renderer = pio.renderers.default if renderer is None else renderer
    names = [n for n in (renderer or "").split("+") if n]
    makes_output = any(n in pio.renderers and isinstance(pio.renderers[n], MimetypeRenderer)
                       for n in names if n != IMAGE_RENDERER)
    if IMAGE_RENDERER in names or not makes_output:
        return renderer
    return "+".join([*names, IMAGE_RENDERER])


class StaticImageRenderer(MimetypeRenderer):
    """plotly's ``"hybridnb_image"`` renderer (registered on first use, not at import)."""

    draw = None  # a StaticFigure's drawing: plotly sets it on a copy of the renderer per figure

    def to_mimebundle(self, fig_dict):
        return image_bundle(fig_dict, self.draw)


class StaticFigure(go.Figure):
    """A plotly ``go.Figure`` (hybridnb's own) that carries its image in every notebook output it
    makes (shown at a cell's end, ``.show()``, ``display()``), whether or not
    ``static_figures()`` was called. The image is ``_draw``'s drawing of the results the figure
    was made from; once the figure is edited (a title, a trace), it is translated instead."""

    _draw: Callable[[], Any] | None = None
    _made = ""  # the figure's JSON when made: what ``_draw`` draws

    def __reduce__(self):  # pickled or copied, it keeps its drawing
        return (*super().__reduce__(), {"_draw": self._draw, "_made": self._made})

    def _drawing(self) -> Callable[[], Any] | None:
        return self._draw if self._draw is not None and self.to_json() == self._made else None

    def _repr_mimebundle_(self, include=None, exclude=None, validate=True, **kwargs):
        draw = self._drawing()
        bundle = super()._repr_mimebundle_(include, exclude, validate, draw=draw, **kwargs)
        if bundle and not any(k.startswith("image/") for k in bundle):
            bundle.update(image_bundle(self, draw))
        return bundle

    def _ipython_display_(self):
        if pio.renderers.render_on_display and pio.renderers.default:
            self.show()
        else:
            print(repr(self))

    def show(self, renderer=None, validate=True, **kwargs):
        pio.show(self, renderer=with_image(renderer), validate=validate, draw=self._drawing(),
                 **kwargs)


def static_figure(fig: Any, draw: Callable[[], Any]) -> StaticFigure:
    """``fig`` as a ``StaticFigure`` whose image ``draw`` makes (a matplotlib Figure)."""
    out = StaticFigure(fig)
    out._draw, out._made = draw, out.to_json()
    return out
