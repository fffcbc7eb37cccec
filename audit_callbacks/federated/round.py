"""The typed record of one DP-FedAvg round: who took part, what each client gave, what was released.

:class:`~audit_callbacks.federated.DPFedAvg` runs a round as six stages (sample -> local train ->
clip -> randomize -> aggregate -> server step, see :mod:`audit_callbacks.federated.protocol`);
each stage returns a new :class:`FederatedRound` with its own fields filled in, and the audit hooks
receive it. Client ids are integers everywhere: a real client's id is its index into the
module's client datasets (``pl_module.client_data(cid)``), a virtual client's id is its owner's
local index ``0..count-1``, and each row of the update matrix names its owner in
:attr:`FederatedRound.row_owner`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

__all__ = ["REAL_CLIENT", "Cohort", "FederatedRound"]

#: :attr:`FederatedRound.row_owner` of a real client's row (a virtual client's row holds its
#: owner's index in :attr:`FederatedRound.owners`, >= 0).
REAL_CLIENT = -1


def _ids(values: Any, what: str) -> np.ndarray:
    """``values`` as a read-only 1-D int64 array (a round's record is not edited by its readers)."""
    if np.ndim(values) > 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {np.shape(values)}")
    arr = np.array(values, dtype=np.int64, copy=True).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Cohort:
    """The clients of one round.

    Attributes:
        real_ids: sorted ids ``[n_real]`` (int64) of the real clients, indices into the module's
            client datasets.
        virtual_ids: ``{owner name: sorted local indices [n_k] (int64)}`` of the virtual clients
            in the round, sampled and scheduled together, one entry (possibly empty) per
            registered owner, in registration order.
        population_ids: sorted ids (int64) of every client of the round in the sampler's
            population: real clients ``0..N_real-1``, then each owner's block (the index of
            :meth:`DPFedAvg.participations <audit_callbacks.federated.DPFedAvg.participations>`).
        divisor: m, what the noisy sum is divided by (the fixed cohort size ``clients_per_round``;
            for Poisson sampling the expected size, not :attr:`size`).
    """

    real_ids: np.ndarray
    virtual_ids: Mapping[str, np.ndarray]
    population_ids: np.ndarray
    divisor: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "real_ids", _ids(self.real_ids, "real_ids"))
        object.__setattr__(self, "population_ids", _ids(self.population_ids, "population_ids"))
        virtual = {str(k): _ids(v, f"virtual_ids[{k!r}]") for k, v in self.virtual_ids.items()}
        object.__setattr__(self, "virtual_ids", MappingProxyType(virtual))
        if int(self.divisor) < 1:
            raise ValueError(f"divisor must be >= 1, got {self.divisor}")
        object.__setattr__(self, "divisor", int(self.divisor))

    @property
    def size(self) -> int:
        """The number of clients in the round (real + virtual)."""
        return int(self.population_ids.size)


@dataclass(frozen=True, eq=False)
class FederatedRound:
    """One round of DP-FedAvg, as far as its stages have run.

    Tensors are flat parameter vectors of dimension ``d = pl_module.num_parameters`` (trainable
    parameters in ``model.parameters()`` order), on the device and in the dtype of the model's
    trainable parameters. Readers must not modify them.

    Rows. The update matrix has one row per client that gave a row: the real clients first (in
    ``cohort.real_ids`` order), then each owner's virtual clients in registration order (in
    ``cohort.virtual_ids[name]`` order). An owner that gave the sum of its clipped updates
    instead (:attr:`summed`) has no rows. Row ``i`` is the client ``row_ids[i]`` of
    ``row_owner[i]`` (:data:`REAL_CLIENT`, or an index into :attr:`owners`).

    Attributes:
        index: the round, 1-based (``pl_module.round`` once the round is over).
        cohort: the clients of the round (:class:`Cohort`).
        theta: the global model ``[d]`` at the start of the round, theta_{t-1}.
        clip_norm: C, the L2 bound of each client's update.
        owners: the registered owners' names, in registration order (the order of the sum).
        updates: ``[n, d]`` the client updates (set by local training; clipped to ``clip_norm``
            in place by the clip stage, which every hook sees), or None before local training.
        row_owner: ``[n]`` int64, the owner of each row (see Rows above).
        row_ids: ``[n]`` int64, the client id of each row within its owner.
        summed: the owners that gave the sum of their clipped updates, not rows, this round.
        client_loss: the real clients' mean local training loss (NaN without local steps).
        randomizer: the local randomizer that produced :attr:`released` (None: no local DP).
        released: ``[n, d]`` the randomized rows the clients release (local DP), else None.
        average: ``[d]`` the noisy average the server applies: (sum of the rows, or of their
            ``randomizer.debias``, + each summing owner's sum + N(0, (z C)^2 I)) / ``divisor``.
        model_delta: ``[d]`` theta_t - theta_{t-1} after the server optimizer step.
    """

    index: int
    cohort: Cohort
    theta: torch.Tensor
    clip_norm: float
    owners: tuple[str, ...] = ()
    updates: torch.Tensor | None = None
    row_owner: np.ndarray = field(default_factory=lambda: _ids([], "row_owner"))
    row_ids: np.ndarray = field(default_factory=lambda: _ids([], "row_ids"))
    summed: tuple[str, ...] = ()
    client_loss: float = math.nan
    randomizer: Any = None
    released: torch.Tensor | None = None
    average: torch.Tensor | None = None
    model_delta: torch.Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_owner", _ids(self.row_owner, "row_owner"))
        object.__setattr__(self, "row_ids", _ids(self.row_ids, "row_ids"))
        object.__setattr__(self, "owners", tuple(self.owners))
        object.__setattr__(self, "summed", tuple(self.summed))
        if self.row_owner.shape != self.row_ids.shape:
            raise ValueError(f"row_owner {self.row_owner.shape} and row_ids {self.row_ids.shape} differ")
        for name, rows in (("updates", self.updates), ("released", self.released)):
            if rows is not None and rows.shape[0] != self.row_ids.size:
                raise ValueError(f"{name} has {rows.shape[0]} rows, row_ids {self.row_ids.size}")
        if self.row_owner.size and int(self.row_owner.max()) >= len(self.owners):
            raise ValueError("row_owner names an owner that is not in owners")

    @property
    def real_rows(self) -> np.ndarray:
        """Positions ``[n_real]`` (int64) of the real clients' rows; their ids are
        ``row_ids[real_rows]``."""
        return np.flatnonzero(self.row_owner == REAL_CLIENT)

    def rows_of(self, owner: str) -> np.ndarray:
        """Positions (int64) of the rows of owner ``owner``'s virtual clients (empty for an owner
        that gave a sum, or had no client in the round).

        Raises:
            KeyError: ``owner`` is not a registered owner.
        """
        if owner not in self.owners:
            raise KeyError(f"{owner!r} is not a registered owner ({list(self.owners)})")
        return np.flatnonzero(self.row_owner == self.owners.index(owner))
