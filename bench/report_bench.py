"""How long a report of a long run takes to write and to open (docs/benchmarks.md, "Report").

Builds the synthetic Chat Completions runs of bench/steps_bench.py (one tool call and a
1,000-character result per step, every request repeating the conversation), then for each size:
the wall time of ``pvisor report RUN`` and the page's size, and the time headless Chromium takes
from navigation to the page's script being done (``window.pvisorReadyMs``), for the page as it
opens (the first 200 exchanges rendered, the rest as the reader scrolls) and, as the baseline in
the same run, with ``#all`` (every exchange rendered at once). Best of ``--repeat``.

    python bench/report_bench.py [--steps 200,2000] [--repeat 3]
    (needs Debian's chromium and chromium-driver, and selenium: the test extra)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="200,2000")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    pvisor = shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor"
    tmp = Path(tempfile.mkdtemp(prefix="pvisor-report-bench-"))
    driver = browser()
    print(
        "| steps | `pvisor report` | page | opens (first 200 rendered) | `#all` (baseline: every exchange) |"
    )
    print("|---|---|---|---|---|")
    try:
        for steps in (int(s) for s in a.steps.split(",")):
            journal = tmp / f"j{steps}.sqlite"
            run = build(journal, steps)
            page = tmp / f"{run}.html"
            writes = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                subprocess.run([pvisor, "--journal", str(journal), "report", run, "-o", str(page)],
                               check=True, stdout=subprocess.DEVNULL)  # fmt: skip
                writes.append(time.perf_counter() - t0)
            opened = {}
            for variant in ("", "#all"):
                times = []
                for _ in range(a.repeat):
                    driver.get("about:blank")
                    driver.get(page.resolve().as_uri() + variant)
                    ready = None
                    for _ in range(300):  # a large page may still be parsing when get() returns
                        ready = driver.execute_script("return window.pvisorReadyMs")
                        if ready is not None:
                            break
                        time.sleep(0.1)
                    if ready is None:
                        raise SystemExit(f"{page}{variant}: the page's script did not finish within 30 s")
                    times.append(ready / 1000)
                opened[variant] = min(times)
            size = page.stat().st_size / 1e6
            print(
                f"| {steps:,} | {min(writes):.2f} s | {size:.1f} MB | {opened['']:.2f} s "
                f"| {opened['#all']:.2f} s |",
                flush=True,
            )
    finally:
        driver.quit()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
