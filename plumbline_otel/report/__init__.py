"""Certificates: build from runs and a spec, validate when read back, render as text."""

from plumbline_otel.report.certificate import (
    CERTIFICATE_KIND,
    CERTIFICATE_VERSION,
    Cell,
    agent_label,
    build_certificate,
    evidence_digest,
    evidence_hash,
)
from plumbline_otel.report.render import CertificateError, load_certificate, render_text, validate

__all__ = [
    "CERTIFICATE_KIND",
    "CERTIFICATE_VERSION",
    "Cell",
    "CertificateError",
    "agent_label",
    "build_certificate",
    "evidence_digest",
    "evidence_hash",
    "load_certificate",
    "render_text",
    "validate",
]
