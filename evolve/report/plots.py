"""Plot geometry for the report: a step line of the best so far on round ticks. Builds the
numbers only (positions in SVG user units); templates/plots.svg.j2 draws them."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

Point = tuple[float, float]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k steps) covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def tick_label(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:g}"


@dataclass(frozen=True)
class Tick:
    at: float       # position along its axis, SVG units
    label: str


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    title: str      # the hover text: what the point is


@dataclass
class StepPlot:
    """A best-so-far step line (each value holds until the next) in a width x height box.
    Sizes are chosen to read on a laptop screen: 13-14 px text at 100 % zoom."""
    title: str
    x_label: str
    y_label: str
    width: int = 560
    height: int = 320
    left: int = 64
    right: int = 20
    top: int = 34
    bottom: int = 52
    path: str = ""                            # the step line as an SVG path, empty when no data
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    empty_text: str = "no confirmed best yet"

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom


def step_plot(points: Sequence[Point], *, title: str, x_label: str, y_label: str,
              markers: Sequence[Point] = (), marker_title: str = "promoted") -> StepPlot:
    plot = StepPlot(title=title, x_label=x_label, y_label=y_label)
    if not points:
        return plot
    xs = [p[0] for p in points] + [m[0] for m in markers]
    ys = [p[1] for p in points] + [m[1] for m in markers]
    x_ticks = nice_ticks(min(0.0, min(xs)), max(xs))
    y_ticks = nice_ticks(min(ys) - 0.05 * abs(min(ys)), max(ys) + 0.02 * abs(max(ys)))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return round(plot.left + (x - x0) / ((x1 - x0) or 1) * plot.plot_w, 1)

    def sy(y: float) -> float:
        return round(plot.top + plot.plot_h - (y - y0) / ((y1 - y0) or 1) * plot.plot_h, 1)

    plot.x_ticks = [Tick(sx(t), tick_label(t)) for t in x_ticks]
    plot.y_ticks = [Tick(sy(t), tick_label(t)) for t in y_ticks]
    steps = [f"M{sx(points[0][0])},{sy(points[0][1])}"]
    steps += [f"H{sx(x)}V{sy(y)}" for x, y in points[1:]]
    steps.append(f"H{sx(max(xs))}")
    plot.path = "".join(steps)
    plot.markers = [Marker(sx(x), sy(y), f"{marker_title}: {y:.3f}x at {x:g}") for x, y in markers]
    return plot
