"""Harbor's ATIF validator for the tests: the session fixture ``harbor`` (imported by
conftest.py) runs tests/harbor_validate.py with the Python of Harbor's venv, which scripts/test
makes (.venv-harbor, Python 3.12+) and names in $PVISOR_HARBOR_PYTHON. Without it the tests
that use it cannot run: skipped on a developer's machine, failed in CI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: the Harbor version tests/harbor-requirements.txt pins (the one scripts/test installs)
PIN = next(
    line.split("==", 1)[1].strip()
    for line in (HERE / "harbor-requirements.txt").read_text().splitlines()
    if line.startswith("harbor==")
)


@pytest.fixture(scope="session")
def harbor():
    """``harbor(paths)``: {path: Harbor's validation errors} of the ATIF files ``paths``, from one
    run of Harbor's validator in its venv."""
    env = os.environ.get("PVISOR_HARBOR_PYTHON")
    python = Path(env) if env else REPO / ".venv-harbor" / "bin" / "python"
    if not python.is_file():
        from conftest import cannot_run_here  # here: conftest imports this module

        cannot_run_here(
            f"no Python of Harbor's venv at {python} (./scripts/test makes it; $PVISOR_HARBOR_PYTHON)"
        )

    def validate(paths: list[Path]) -> dict[str, list[str]]:
        proc = subprocess.run(
            [str(python), str(HERE / "harbor_validate.py"), *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=300,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["harbor"] == PIN, f"Harbor {doc['harbor']} in {python}, the tests pin {PIN}"
        assert sorted(doc["errors"]) == sorted(map(str, paths))
        return doc["errors"]

    return validate
