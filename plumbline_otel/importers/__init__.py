"""Importers: other systems' recorded runs, turned into OTLP spans and ingested like live traffic."""

from plumbline_otel.importers.plumbline03 import ImportResult, import_run_dir, outcome_cells, read_run_dir

__all__ = ["ImportResult", "import_run_dir", "outcome_cells", "read_run_dir"]
