"""The replay's figure as a self-contained SVG (no plotting library needed): per landscape,
the median best-so-far time over seeds (relative to the optimum) against evaluations, one
line per strategy, and random search's exact expectation dashed."""
from __future__ import annotations

import math
from html import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]
PANEL_W, PANEL_H, PAD = 360, 240, 46


def svg_curves(panels: list[dict], columns: int = 3) -> str:
    """`panels`: {title, budget, curves: {label: [(evals, ratio)]}, random: [(evals, ratio)],
    target: ratio line (1 + within)}."""
    rows = math.ceil(len(panels) / columns)
    width, height = columns * PANEL_W, rows * PANEL_H + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    labels: list[str] = []
    for panel in panels:
        for label in panel["curves"]:
            if label not in labels:
                labels.append(label)
    colour = {label: COLOURS[i % len(COLOURS)] for i, label in enumerate(labels)}
    for n, panel in enumerate(panels):
        ox, oy = (n % columns) * PANEL_W, (n // columns) * PANEL_H
        x0, y0, x1, y1 = ox + PAD, oy + 20, ox + PANEL_W - 10, oy + PANEL_H - 30
        top = 2.0   # y axis: best time / optimum, from 1.0 to 2.0 (clipped)
        xmax = max(2, panel["budget"])

        # the panel's geometry bound now: the closures outlive this iteration's names
        def px(e: float, x0: float = x0, x1: float = x1, xmax: float = xmax) -> float:
            return x0 + (x1 - x0) * math.log10(max(e, 1)) / math.log10(xmax)

        def py(r: float, y0: float = y0, y1: float = y1, top: float = top) -> float:
            return y1 - (y1 - y0) * (min(r, top) - 1.0) / (top - 1.0)

        out.append(f'<text x="{ox + PANEL_W / 2}" y="{oy + 14}" text-anchor="middle" font-weight="bold">'
                   f'{escape(panel["title"])}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="#999"/>')
        for e in (1, 10, 100, 1000, 10000):
            if e <= xmax:
                out.append(f'<line x1="{px(e):.1f}" y1="{y1}" x2="{px(e):.1f}" y2="{y1 + 4}" stroke="#999"/>'
                           f'<text x="{px(e):.1f}" y="{y1 + 15}" text-anchor="middle">{e}</text>')
        for r in (1.0, 1.25, 1.5, 1.75, 2.0):
            out.append(f'<text x="{x0 - 4}" y="{py(r) + 4:.1f}" text-anchor="end">{r:.2f}</text>')
        target = panel.get("target")
        if target:
            out.append(f'<line x1="{x0}" y1="{py(target):.1f}" x2="{x1}" y2="{py(target):.1f}" '
                       'stroke="#bbb" stroke-dasharray="2,3"/>')
        series = [("random (exact)", panel["random"], "#555", ' stroke-dasharray="6,4"')]
        series += [(label, pts, colour[label], "") for label, pts in panel["curves"].items()]
        for _label, pts, col, dash in series:
            pts = [(e, r) for e, r in pts if r is not None and not math.isinf(r)]
            if len(pts) > 1:
                path = " ".join(f"{px(e):.1f},{py(r):.1f}" for e, r in pts)
                out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="1.6"{dash}/>')
        out.append(f'<text x="{(x0 + x1) / 2}" y="{y1 + 27}" text-anchor="middle" fill="#555">evaluations</text>')
    ly = rows * PANEL_H + 18
    entries = [("random (exact)", "#555")] + [(label, colour[label]) for label in labels]
    for i, (label, col) in enumerate(entries):
        lx = 10 + i * 170
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{col}" stroke-width="2"/>'
                   f'<text x="{lx + 30}" y="{ly}">{escape(label)}</text>')
    out.append(f'<text x="{width - 10}" y="{ly}" text-anchor="end" fill="#555">y: median best time / optimum</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
