"""The one canary auditor, shared by every front end (no Lightning, Flower or Opacus here).

* :class:`CanaryAuditConfig` - the audit's settings, validated once.
* :class:`CanaryAuditor` - canaries -> statistics -> :class:`CanaryReport` -> summary; a
  backend feeds it :meth:`~CanaryAuditor.start` and :meth:`~CanaryAuditor.release` events.
* :class:`NoEstimateYet` - what :meth:`CanaryAuditor.report` raises before there is an
  estimate.
"""

from audit_callbacks.auditing.auditor import CanaryAuditor, NoEstimateYet, ReportSink
from audit_callbacks.auditing.config import CanaryAuditConfig
from audit_callbacks.auditing.report import CanaryReport

__all__ = ["CanaryAuditConfig", "CanaryAuditor", "CanaryReport", "NoEstimateYet", "ReportSink"]
