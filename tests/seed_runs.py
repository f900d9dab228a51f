"""The seed's studies as this project stores them: paths, and one imported study read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plumbline_otel.importers import ImportResult
from plumbline_otel.model import Trajectory
from plumbline_otel.store import Store

SEED_RUNS = Path(__file__).resolve().parents[1] / "runs" / "plumbline03"
SPEC_FILE = Path(__file__).resolve().parents[1] / "configs" / "examples" / "plumbline03_ap.invariants.yaml"


class Imported:
    """One study imported into its own DuckDB file: the import's result and the stored runs."""

    def __init__(self, db: Path, result: ImportResult) -> None:
        self.db, self.result = db, result
        with Store(db, read_only=True) as store:
            self.runs: list[Trajectory] = list(store.trajectories())
        self.by_trial = {str(t.context["plumbline.trial.id"]): t for t in self.runs}

    def published(self, study: str) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((SEED_RUNS / study / "summary.json").read_text())
        return summary
