"""Certificates (the typed model: built, read and validated once, gated, rendered) and the pages: the HTML report, run views and diffs."""

from plumbline_otel.report.certificate import (
    CERTIFICATE_KIND,
    CERTIFICATE_VERSION,
    Cell,
    Certificate,
    build_certificate,
    evidence_digest,
    evidence_hash,
    fault_unexposed,
)
from plumbline_otel.report.gate import GateVerdict, gate_verdict
from plumbline_otel.report.pages import write_report
from plumbline_otel.report.render import CertificateError, load_certificate, render_text, validate
from plumbline_otel.runs import agent_label

__all__ = [
    "CERTIFICATE_KIND",
    "CERTIFICATE_VERSION",
    "Cell",
    "Certificate",
    "CertificateError",
    "GateVerdict",
    "agent_label",
    "build_certificate",
    "evidence_digest",
    "evidence_hash",
    "fault_unexposed",
    "gate_verdict",
    "load_certificate",
    "render_text",
    "validate",
    "write_report",
]
