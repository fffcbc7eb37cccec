"""Label-DP lower bounds from the last-layer label attack (Yuan, Xue, Wang & Shen 2022, "Deep
Gradient Attacks with Strong DP-SGD Lower Bounds for Label Privacy"), numpy and scipy only.

Built around one K-class computation; a sigmoid logit is its case K = 2. One module per concept,
each importing only the ones above it (no cycle):

* :mod:`.inputs` -- array checks, the attacked layer's design matrix and Gram inverse diagonal
  (:func:`last_layer_gram_inverse_diag`), clip factors.
* :mod:`.attack` -- the probability that the attack outputs a label, eq. (3) of
  docs/methods/label_dp_multiclass.md (:func:`argmin_attack_success_probability`).
* :mod:`.kclass` -- P0, P1 and LB of every example over the replacement labels, eq. (4)-(5),
  and the embedding of a sigmoid logit as two classes.
* :mod:`.step` -- one DP-SGD step (Opacus): :func:`label_dp_lower_bound` ->
  :class:`LabelDPBounds` (the bounds as :class:`~audit_callbacks.estimators.result.AuditResult`)
  with its per-example arrays in :class:`LabelDPDetail`; :func:`flipped_clip_factors`.
* :mod:`.client` -- one FedSGD client's update in DP-FedAvg:
  :func:`client_update_label_dp_lower_bound` -> :class:`ClientLabelDPBound`.
* :mod:`.extrapolation` -- the paper's extrapolation to M batches (App. A.3.1).

The formulas are in docs/methods/label_dp.md (B1-B10) and docs/methods/label_dp_multiclass.md.
"""

from .attack import argmin_attack_success_probability
from .client import ClientLabelDPBound, ClientLabelDPDetail, client_update_label_dp_lower_bound
from .extrapolation import extrapolate_lower_bound, extrapolation_factor
from .inputs import last_layer_gram_inverse_diag
from .step import LabelDPBounds, LabelDPDetail, flipped_clip_factors, label_dp_lower_bound

__all__ = [
    "ClientLabelDPBound",
    "ClientLabelDPDetail",
    "LabelDPBounds",
    "LabelDPDetail",
    "argmin_attack_success_probability",
    "client_update_label_dp_lower_bound",
    "extrapolate_lower_bound",
    "extrapolation_factor",
    "flipped_clip_factors",
    "label_dp_lower_bound",
    "last_layer_gram_inverse_diag",
]
