"""The one canary auditor, shared by every front end (no Lightning, Flower or Opacus here).

* :class:`CanaryAuditConfig` - the audit's settings, validated once.
* :class:`CanaryAuditor` - canaries -> statistics -> :class:`CanaryReport` -> summary; a
  backend feeds it :meth:`~CanaryAuditor.start` and :meth:`~CanaryAuditor.release` events.
* :class:`NoEstimateYet` - what :meth:`CanaryAuditor.report` raises before there is an
  estimate.
* :class:`AuditOutput` - the one output path of every audit (warnings once, the run's folder,
  the summary in one schema, :func:`validate_summary`, the sinks, the report sections); the
  audits of one run share an :class:`AuditRun`, which writes the report.
"""

from audit_callbacks.auditing.auditor import CanaryAuditor, NoEstimateYet, ReportSink
from audit_callbacks.auditing.config import CanaryAuditConfig
from audit_callbacks.auditing.output import AuditOutput, AuditRun, validate_summary
from audit_callbacks.auditing.report import CanaryReport

__all__ = ["AuditOutput", "AuditRun", "CanaryAuditConfig", "CanaryAuditor", "CanaryReport", "NoEstimateYet",
           "ReportSink", "validate_summary"]
