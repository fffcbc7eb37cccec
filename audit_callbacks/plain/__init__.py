"""Front ends for training without Lightning: :class:`~.opacus_audit.OpacusCanaryAudit` audits a
plain-PyTorch Opacus loop."""

from audit_callbacks.auditing.auditor import NoEstimateYet
from audit_callbacks.plain.opacus_audit import OpacusCanaryAudit

__all__ = ["NoEstimateYet", "OpacusCanaryAudit"]
