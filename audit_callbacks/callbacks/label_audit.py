"""Label-privacy callbacks for Opacus DP-SGD (Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks
with Strong DP-SGD Lower Bounds for Label Privacy"; K classes: docs/methods/label_dp_multiclass.md).

* :class:`~audit_callbacks.callbacks.label_reconstruction.LabelReconstructionAttack` - the
  adversary sees the privatized aggregated gradient of one linear layer and the per-example
  inputs of that layer, and reconstructs the batch's labels (or their counts on a narrow head).
* :class:`~audit_callbacks.callbacks.label_dp.LabelDPLowerBound` - label-DP lower bounds of one
  step (binary or softmax), their extrapolation to the run, the single-step upper bound and the
  accountant's epsilon, on one TensorBoard chart.
* :class:`~audit_callbacks.callbacks.label_step.LabelStepObserver` - the per-step work the two
  share (one QR factorisation and one set of per-example norms per step); pass the same
  observer to both, or let them use the one attached to the optimizer.

This module keeps the historical import path; the code lives in ``label_base``,
``label_step``, ``label_reconstruction`` and ``label_dp``.
"""

from audit_callbacks.callbacks.label_base import SKIP_REASONS
from audit_callbacks.callbacks.label_dp import LabelDPLowerBound, second_last_layer_features
from audit_callbacks.callbacks.label_reconstruction import (
    LabelReconstructionAttack,
    recover_label_counts,
)
from audit_callbacks.callbacks.label_step import LabelStepObserver

__all__ = [
    "SKIP_REASONS",
    "LabelDPLowerBound",
    "LabelReconstructionAttack",
    "LabelStepObserver",
    "recover_label_counts",
    "second_last_layer_features",
]
