"""Reading a measured curve between and a little beyond its points: piecewise linear in log(x)-log(y), the form
in which both layer times against micro-batch size and collective times against message size are close to straight
(a power law per segment). Past the ends the end segment is extended, up to ``reach`` times the measured range."""

from __future__ import annotations

import math


def loglog(points: list[tuple[float, float]], x: float, reach: float) -> float | None:
    """y at ``x`` on the curve through ``points`` ((x, y), x > 0, y > 0), or None outside
    [min_x / reach, max_x * reach]. One point: y scaled in proportion to x within the reach."""
    pts = sorted({px: py for px, py in points if px > 0 and py > 0}.items())
    if not pts or x <= 0:
        return None
    lo, hi = pts[0][0], pts[-1][0]
    if x < lo / reach or x > hi * reach:
        return None
    if len(pts) == 1:
        return pts[0][1] * x / pts[0][0]
    # the segment holding x; past an end, the end segment extended
    i = next((k for k in range(1, len(pts)) if x <= pts[k][0]), len(pts) - 1)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    slope = (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + slope * (math.log(x) - math.log(x0)))
