"""How long a report of a long run takes to write and to open (docs/benchmarks.md, "Report").

Builds the synthetic Chat Completions runs of bench/steps_bench.py (one tool call and a
1,000-character result per step, every request repeating the conversation), then for each size:
the wall time of ``pvisor report RUN`` and the page's size, and in headless Chromium the first
contentful paint (``performance``'s ``first-contentful-paint``) and the time from navigation to
the page's script being done (``window.pvisorReadyMs``: header, overview, step index and the
first 200 exchanges drawn), for the page as it opens and with ``#all`` (every exchange rendered
at once). Best of ``--repeat``.

``--baseline COMMIT`` measures, in the same run and on the same journals, the pvisor of COMMIT
(default a79fdcf: the page before issue 43's overview) beside the installed one: the commit's
tree (``git archive``) installed with ``pip --no-deps --target`` into a temporary directory that
leads ``PYTHONPATH`` for its ``python -m pvisor`` (the installed dependencies serve both).
``--baseline none`` measures the installed pvisor alone.

    python bench/report_bench.py [--steps 200,1000,2000] [--repeat 3] [--baseline a79fdcf]
    (needs Debian's chromium and chromium-driver, and selenium: the test extra; git for --baseline)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from steps_bench import build  # noqa: E402  (the same synthetic runs)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    opts.binary_location = os.environ.get("PVISOR_CHROMIUM", "/usr/bin/chromium")
    return webdriver.Chrome(
        service=Service(os.environ.get("PVISOR_CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts
    )


def baseline_pvisor(commit: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the pvisor of ``commit`` (this checkout's git)."""
    tree, site = tmp / "baseline-src", tmp / "baseline-site"
    tree.mkdir()
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(tree)]
    subprocess.run(pip, check=True)
    # PYTHONSAFEPATH: run from a checkout, ``-m pvisor`` would find the checkout's pvisor/ first
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    return [sys.executable, "-m", "pvisor"], env


def opened(driver, url: str, repeat: int) -> tuple[float, float]:
    """Best of ``repeat``: (first contentful paint, script done), in s from navigation."""
    paints, readies = [], []
    for _ in range(repeat):
        driver.get("about:blank")
        driver.get(url)
        ready = None
        for _ in range(300):  # a large page may still be parsing when get() returns
            ready = driver.execute_script("return window.pvisorReadyMs")
            if ready is not None:
                break
            time.sleep(0.1)
        if ready is None:
            raise SystemExit(f"{url}: the page's script did not finish within 30 s")
        paint = None
        for _ in range(50):  # the paint entry comes a frame after the script is done
            paint = driver.execute_script(
                "const p = performance.getEntriesByName('first-contentful-paint')[0];"
                "return p ? p.startTime : null"
            )
            if paint is not None:
                break
            time.sleep(0.1)
        paints.append((paint or float("nan")) / 1000)
        readies.append(ready / 1000)
    return min(paints), min(readies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="200,1000,2000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default="a79fdcf", help="a commit to measure beside, or none")
    a = ap.parse_args()
    installed = shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor"
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-report-bench-"))
    versions = [("this", [installed], dict(os.environ))]
    if a.baseline != "none":
        versions.append((a.baseline, *baseline_pvisor(a.baseline, tmp)))
    driver = browser()
    print(
        "| steps | pvisor | `pvisor report` | page | first contentful paint | ready (first 200 drawn) "
        "| `#all` ready |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for steps in (int(s) for s in a.steps.split(",")):
            journal = tmp / f"j{steps}.sqlite"
            run = build(journal, steps)
            for name, command, env in versions:
                page = tmp / f"{run}-{name}.html"
                writes = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    subprocess.run([*command, "--journal", str(journal), "report", run, "-o", str(page)],
                                   check=True, stdout=subprocess.DEVNULL, env=env)  # fmt: skip
                    writes.append(time.perf_counter() - t0)
                paint, ready = opened(driver, page.resolve().as_uri(), a.repeat)
                _, ready_all = opened(driver, page.resolve().as_uri() + "#all", a.repeat)
                size = page.stat().st_size / 1e6
                print(
                    f"| {steps:,} | {name} | {min(writes):.2f} s | {size:.1f} MB | {paint:.2f} s "
                    f"| {ready:.2f} s | {ready_all:.2f} s |",
                    flush=True,
                )
    finally:
        driver.quit()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
