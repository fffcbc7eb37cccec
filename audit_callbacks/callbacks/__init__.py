"""Lightning callbacks: the glue between training and the estimators."""

from audit_callbacks.callbacks.canary_audit import CanaryAudit

__all__ = ["CanaryAudit"]
