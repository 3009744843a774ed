"""The matplotlib settings every static image of hybridnb shares (one place for both drawings:
hybridnb's own panels and the translated user figures)."""

DPI = 100  # plotly's px = matplotlib's pixels at this dpi
RC = {"font.size": 9, "axes.titlesize": 10}  # plotly's 12 px text at 100 dpi
