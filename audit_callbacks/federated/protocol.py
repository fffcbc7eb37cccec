"""The audit protocol that :class:`~audit_callbacks.federated.DPFedAvg` calls on callbacks.

A Lightning callback takes part by implementing any of the methods of
:class:`FederatedAuditHooks`; the module looks each one up on every callback of the trainer and
skips those that do not define it. All tensors are flat parameter vectors of dimension
``d = pl_module.num_parameters`` (trainable parameters, in ``model.parameters()`` order).

Virtual clients (canaries) are registered with
:meth:`DPFedAvg.register_virtual_clients <audit_callbacks.federated.DPFedAvg.register_virtual_clients>`
from the callback's ``setup`` or ``on_fit_start``. A virtual client joins the population and is
sampled by exactly the same rule as a real client (Andrew et al., ICLR 2024, §4, Alg. 2); when it is sampled the
module asks its owner for its update. An owner may also give a ``schedule`` that forces some of its
clients into chosen rounds, outside the sampling (repeated canary presentations, Andrew et al. §5.2).

Order within one round ``t`` (1-based, ``t = pl_module.round``):

1. ``on_federated_round_start(trainer, pl_module, round_idx, cohort)``
2. An owner gives the updates of its sampled virtual clients ``indices`` (local indices
   ``0..count-1``, in cohort order) through the first of these it defines:

   * ``federated_client_update_sum(trainer, pl_module, indices, round_idx, clip_norm)``, only in
     a round where nobody needs the rows (no ``on_federated_client_updates`` hook and no local
     randomizer): it returns the sum ``[d]`` of the clients' updates, each clipped by
     :func:`~audit_callbacks.federated.clipping.clip_updates_` (the module's own clipping) in
     the dtype and on the device of the module's trainable parameters, so that the module
     neither holds nor clips those rows. Called after the real clients trained. A sum that is
     not a finite vector of ``d`` entries raises ``ValueError``.
   * ``federated_client_updates(trainer, pl_module, indices, round_idx, clip_norm, out)``, once:
     it writes the updates into the rows ``out`` ``[m, d]`` of the round's update matrix (one call
     a round instead of one a client). It must write every row: the matrix is not initialised.
   * ``federated_client_update(trainer, pl_module, index, round_idx, clip_norm)`` for each
     client, returning its update ``[d]``.

   The module sums the real clients' clipped rows, then each owner's (its rows, or the sum it
   gave), in that order, so the three give the same model bit for bit.
3. ``on_federated_client_updates(trainer, pl_module, round_idx, client_ids, updates)``:
   ``updates`` ``[m, d]`` are the clipped updates before noise (read-only)
4. ``on_federated_randomized_updates(trainer, pl_module, round_idx, client_ids, released)``: only
   with a local randomizer (LDP): the rows ``[m, d]`` the clients release (read-only)
5. ``on_federated_round_end(trainer, pl_module, round_idx, model_delta)``: ``model_delta`` ``[d]`` is
   ``theta_t - theta_{t-1}`` after the server optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    import lightning.pytorch as pl

__all__ = ["Cohort", "FederatedAuditHooks"]


@dataclass(frozen=True)
class Cohort:
    """The clients of one round.

    Attributes:
        round_idx: the round, 1-based.
        real_ids: sorted ids of the real clients (indices into ``client_datasets``).
        virtual: ``{owner_name: local indices}`` of the virtual clients in the round, sampled
            and scheduled together.
        size: the number of clients in the round (real + virtual).
        divisor: what the noisy sum is divided by (the fixed cohort size m).
    """

    round_idx: int
    real_ids: np.ndarray
    virtual: dict[str, np.ndarray]
    size: int
    divisor: int


@runtime_checkable
class FederatedAuditHooks(Protocol):
    """Optional methods a callback implements to audit DP-FedAvg (see the module docstring)."""

    def federated_client_update(
        self, trainer: pl.Trainer, pl_module: Any, index: int, round_idx: int, clip_norm: float,
    ) -> torch.Tensor:  # pragma: no cover - protocol
        """The update ``[d]`` of this owner's virtual client ``index`` in round ``round_idx``."""
        ...

    def federated_client_update_sum(
        self, trainer: pl.Trainer, pl_module: Any, indices: np.ndarray, round_idx: int,
        clip_norm: float,
    ) -> torch.Tensor:  # pragma: no cover - protocol
        """The sum ``[d]`` of the updates of virtual clients ``indices`` ``[m]``, each clipped
        to ``clip_norm`` by ``clip_updates_``; preferred over the two others where the round
        needs no rows (see the module docstring)."""
        ...

    def federated_client_updates(
        self, trainer: pl.Trainer, pl_module: Any, indices: np.ndarray, round_idx: int,
        clip_norm: float, out: torch.Tensor,
    ) -> None:  # pragma: no cover - protocol
        """Write the updates of virtual clients ``indices`` ``[m]`` into every row of ``out``
        ``[m, d]`` (the module's device and dtype, not initialised); preferred over
        :meth:`federated_client_update`."""
        ...

    def on_federated_round_start(
        self, trainer: pl.Trainer, pl_module: Any, round_idx: int, cohort: Cohort,
    ) -> None:  # pragma: no cover - protocol
        ...

    def on_federated_client_updates(
        self, trainer: pl.Trainer, pl_module: Any, round_idx: int, client_ids: list[str],
        updates: torch.Tensor,
    ) -> None:  # pragma: no cover - protocol
        ...

    def on_federated_randomized_updates(
        self, trainer: pl.Trainer, pl_module: Any, round_idx: int, client_ids: list[str],
        released: torch.Tensor,
    ) -> None:  # pragma: no cover - protocol
        ...

    def on_federated_round_end(
        self, trainer: pl.Trainer, pl_module: Any, round_idx: int, model_delta: torch.Tensor,
    ) -> None:  # pragma: no cover - protocol
        ...
