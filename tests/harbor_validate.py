"""Harbor's own ATIF validator over many files in one process, run by the Python of Harbor's venv
(``.venv-harbor``, made by scripts/test; tests/test_harbor_atif.py calls it as a subprocess).

``python tests/harbor_validate.py FILE...`` validates each FILE with
``harbor.utils.trajectory_validator.TrajectoryValidator``, what Harbor's
``python -m harbor.utils.trajectory_validator FILE`` runs (the pydantic models of
``harbor.models.trajectories``), and prints one JSON object on stdout:
``{"harbor": VERSION, "errors": {FILE: [message, ...]}}`` (an empty list: Harbor accepts FILE).
It imports nothing of pvisor: it runs on Harbor's Python, not the suite's."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from harbor.utils.trajectory_validator import TrajectoryValidator


def main(paths: list[str]) -> None:
    errors: dict[str, list[str]] = {}
    for path in paths:
        validator = TrajectoryValidator()
        validator.validate(path)
        errors[path] = list(validator.get_errors())
    json.dump({"harbor": version("harbor"), "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
