"""The report as a reader sees it: `evolve report` on a migrated SQLite database, opened in
headless Chromium (Debian's `chromium`, installed by .ci/run), screenshotted at a laptop's
window size and its DOM dumped. Skipped only where no Chromium can be found. About 10 s."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.population import Population

from .conftest import add_tools_and_a_crash, populate

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LAPTOP = (1366, 768)


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on PATH (Debian package 'chromium'; .ci/run installs it): the report is not "
                "checked in a browser here")


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--allow-file-access-from-files", f"--user-data-dir={profile}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def report(pop: Population, workload: int, db_url: str, tmp_path: Path) -> tuple[Path, dict[str, int]]:
    ids = populate(pop, workload)
    ids["crash"] = add_tools_and_a_crash(pop, workload, ids)
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "evolve", "report", "--db", db_url, "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return out, ids


def test_the_report_renders_in_headless_chromium(report: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    browser = _browser()
    page, ids = report
    shot = tmp_path / "report.png"
    done = _chromium(browser, tmp_path / "profile", f"--window-size={LAPTOP[0]},{LAPTOP[1]}",
                     f"--screenshot={shot}", page.as_uri())
    assert shot.is_file(), done.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page of this size is a few KiB
    with Image.open(shot) as img:
        assert img.size == LAPTOP
        grey = img.convert("L")
        assert ImageStat.Stat(grey).stddev[0] > 20, "the screenshot is (nearly) one colour"
        # Text and table lines: a good share of the first screen is not background.
        inked = sum(count for value, count in enumerate(grey.histogram()) if value < 200)
        assert inked > 0.01 * LAPTOP[0] * LAPTOP[1]
        # The best row's green band is on the first screen (the leaderboard comes first).
        rgb = img.convert("RGB")
        assert (232, 246, 234) in {rgb.getpixel((x, y)) for x in range(60, 400, 7) for y in range(0, LAPTOP[1], 3)}

    dom = _chromium(browser, tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "{{" not in html and "{%" not in html and "Undefined" not in html  # no template left over
    assert html.count("<svg") == 2 and html.count('<circle') == 4           # two plots, two promotions each
    assert len(re.findall(r"<article class=\"candidate\" id=\"c\d+\"", html)) == 5  # 3 ranked, 2 failed
    assert f'id="c{ids["crash"]}"' in html and f'id="run{ids["run"]}"' in html
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for section in ("leaderboard", "progress", "failures", "timing", "runs", "candidates"):
        assert f'<section id="{section}">' in html
