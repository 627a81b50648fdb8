"""Exports of recorded runs (a Trainer's output_dir, an ``arttrace gateway --out`` folder,
saved trajectories): SFT data (:func:`export_sft`), a Parquet table (:func:`export_parquet`),
and OTel GenAI spans sent to an OTLP endpoint (:func:`export_otlp`). Each reads the runs one at
a time, and writes text shaped like a key redacted, as the journal's error texts are.

The command, ``arttrace export RUN_DIR ... --format sft|parquet|otlp``, is
:mod:`arttrace.app.export_command`."""

from ._otlp import export_otlp
from ._parquet import export_parquet
from ._sft import export_sft, sft_lines
from ._summary import ExportError, ExportSummary

__all__ = [
    "ExportError",
    "ExportSummary",
    "export_otlp",
    "export_parquet",
    "export_sft",
    "sft_lines",
]
