"""Per-client update clipping of DP-FedAvg (McMahan et al. 2018; Andrew et al. 2024, Alg. 2, step 3).

Shared by :class:`~audit_callbacks.federated.DPFedAvg` and by the owners of virtual clients that
give the module the sum of their clipped updates (``VirtualClientSumOwner.client_update_sum``,
see :mod:`audit_callbacks.federated.protocol`).
"""

from __future__ import annotations

import torch

__all__ = ["clip_updates_"]


def clip_updates_(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Clip every row of ``updates`` ``[m, d]`` to L2 norm at most ``clip_norm`` (C), in place:
    row i is multiplied by ``min(1, C / ||u_i||)`` (a zero row stays zero).

    A row's result does not depend on the other rows, so clipping a block of rows alone gives
    the same bits as clipping it inside a larger matrix.

    Returns:
        The row norms before clipping, ``[m]`` (NaN or inf for a non-finite row, which the
        caller should reject: such a row is not clipped to a finite vector).
    """
    norms = torch.linalg.vector_norm(updates, 2.0, 1)
    factors = torch.clamp(float(clip_norm) / norms.clamp_min(1e-12), max=1.0)
    updates.mul_(factors.unsqueeze(1))
    return norms
