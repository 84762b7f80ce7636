"""The HTML report of a search (`evolve report`): data builders in progress, candidates,
runs and plots; the view in page and templates/."""
from evolve.report.page import build_report, render_data, render_plot, render_report
from evolve.report.plots import nice_ticks, step_plot
from evolve.report.progress import best_so_far

__all__ = ["best_so_far", "build_report", "nice_ticks", "render_data", "render_plot", "render_report", "step_plot"]
