"""Per-client update clipping of DP-FedAvg (McMahan et al. 2018; Andrew et al. 2024, Alg. 2, step 3).

:meth:`DPFedAvg.clip_updates <audit_callbacks.federated.DPFedAvg.clip_updates>` (the module's
clip stage) calls it on the real clients' rows and on the virtual clients' (canaries'); owners
that give the module the sum of their clipped updates (``VirtualClientSumOwner.
client_update_sum``, see :mod:`audit_callbacks.federated.protocol`) clip through the module too,
so that a subclass's clipping, or a bug in it, acts on canaries exactly as on real updates.
"""

from __future__ import annotations

import math

import torch

__all__ = ["clip_updates_"]


def clip_updates_(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Clip every row of ``updates`` ``[m, d]`` to L2 norm at most ``clip_norm`` (C), in place:
    row i is multiplied by ``min(1, C / ||u_i||)`` (a zero row stays zero).

    A finite row whose norm overflows the dtype (a float32 row with 1e30 in one coordinate:
    its square, 1e60, is above float32's 3.4e38) is clipped with its norm computed in float64,
    scaled by its largest entry, so it comes out at norm C instead of raising or vanishing;
    every other row gets the bits of the formula in its own dtype. A row's result does not
    depend on the other rows, so clipping a block of rows alone gives the same bits as clipping
    it inside a larger matrix.

    Returns:
        The row norms before clipping, ``[m]`` in the dtype of ``updates`` (a finite row's norm
        saturates at the dtype's largest finite value; NaN or inf for a row with a NaN or inf
        entry, which the caller should reject: such a row is not clipped to a finite vector).
    """
    norms = torch.linalg.vector_norm(updates, 2.0, 1)
    factors = torch.clamp(float(clip_norm) / norms.clamp_min(1e-12), max=1.0)
    # the common path reads one value back: the sum of the norms is finite when every norm is
    # (2 operations, isfinite().all() is 5); an infinite norm is a finite row whose
    # norm overflows, or a non-finite row. Rare: several huge norms whose sum overflows also
    # come here, and nothing is changed for them
    if not math.isfinite(float(norms.sum())):
        overflow = torch.isinf(norms) & torch.isfinite(updates).all(1)
        if bool(overflow.any()):
            rows = torch.nonzero(overflow).flatten()
            block = updates[rows].to(torch.float64)
            scale = block.abs().amax(1, keepdim=True)
            exact = scale.squeeze(1) * torch.linalg.vector_norm(block / scale, 2.0, 1)
            updates[rows] = block.mul_((float(clip_norm) / exact).clamp(max=1.0).unsqueeze(1)).to(updates.dtype)
            factors[rows] = 1.0  # already clipped
            norms[rows] = exact.clamp(max=torch.finfo(updates.dtype).max).to(norms.dtype)
    updates.mul_(factors.unsqueeze(1))
    return norms
