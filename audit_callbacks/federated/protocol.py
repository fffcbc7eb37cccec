"""How audits take part in :class:`~audit_callbacks.federated.DPFedAvg`'s rounds.

Two roles, each with one explicit interface:

* **Owners of virtual clients** (canaries) implement :class:`VirtualClientOwner` and are passed
  to :meth:`DPFedAvg.register_virtual_clients
  <audit_callbacks.federated.DPFedAvg.register_virtual_clients>` (from a callback's ``setup`` or
  ``on_fit_start``). A virtual client joins the population and is sampled by exactly the same
  rule as a real client (Andrew et al., ICLR 2024, §4, Alg. 2); an owner may also give a
  ``schedule`` that forces some of its clients into chosen rounds, outside the sampling
  (repeated canary presentations, Andrew et al. §5.2).
* **Audit callbacks** subclass :class:`FederatedAuditHooks` (next to Lightning's ``Callback``)
  and override the hooks they need; the module calls the hooks of every callback of the trainer
  that is an instance of :class:`FederatedAuditHooks`, in the trainer's callback order, and no
  other (a callback that merely defines a method of the same name is not called).

Every hook and owner call receives the round's typed record,
:class:`~audit_callbacks.federated.round.FederatedRound` (round index, cohort with int64 arrays
of real and virtual client ids, the update matrix and the owner and id of each row, the released
rows, the model delta). Tensors are flat parameter vectors of dimension
``d = pl_module.num_parameters`` (trainable parameters, in ``model.parameters()`` order); hooks
read them and must not modify them, and keep what they need rather than the record itself (it
holds the round's ``[n, d]`` update matrix).

A round ``t`` (1-based, ``pl_module.round`` once it is over) runs six stages, and the hooks are
called between them:

1. **sample**: the cohort, by the module's sampling rule over real and sampled virtual clients,
   plus scheduled ones. Then ``on_federated_round_start(trainer, pl_module, fl_round)``.
2. **local train**: each sampled real client runs local SGD from the global model; its update is
   ``theta_local - theta_global``. Each owner with clients in the round gives their updates
   through :meth:`VirtualClientOwner.client_updates`, writing its rows of the update matrix
   after the real clients' rows, or, where the owner registered with ``gives_sum=True`` and
   nobody needs the rows (no local randomizer and no audit callback that overrides
   ``on_federated_client_updates``), through :meth:`VirtualClientSumOwner.client_update_sum`
   at the aggregate stage, so that the module neither holds nor clips those rows.
3. **clip**: every row to L2 norm ``clip_norm`` (the module's :meth:`DPFedAvg.clip_updates
   <audit_callbacks.federated.DPFedAvg.clip_updates>`, by default :func:`~audit_callbacks.
   federated.clipping.clip_updates_`; norms of finite huge rows without overflow); a row with
   NaN or inf entries raises ``ValueError`` naming its client. Then
   ``on_federated_client_updates(trainer, pl_module, fl_round)``: ``fl_round.updates`` ``[n, d]``
   are the clipped updates before any noise.
4. **randomize** (only with a local randomizer, LDP): each clipped row is randomized on its
   client; ``fl_round.released`` ``[n, d]``. Then
   ``on_federated_randomized_updates(trainer, pl_module, fl_round)``.
5. **aggregate**: the sum of the real clients' rows (their ``randomizer.debias`` with LDP), then
   of each owner's rows or the sum it gave, in registration order, so that an owner's rows and
   its sum train the same model bit for bit; plus ``N(0, (z C)^2 I_d)``; divided by m:
   ``fl_round.average``.
6. **server step**: the server optimizer takes ``-average`` as its gradient;
   ``fl_round.model_delta`` = theta_t - theta_{t-1}. This is the round's **release**: its
   participations are counted (``pl_module.participations()``, ``pl_module.round``), each
   owner that defines ``on_round_released(fl_round)`` is told (before any hook), then
   ``on_federated_round_end(trainer, pl_module, fl_round)``. A checkpoint saved before the
   release (from a hook of stages 1-5, or by a signal handler such as Lightning's SLURM
   auto-requeue) holds the module's state from before the round: the resumed run samples the
   same cohort again, so no participation is counted twice or lost. One window is not covered:
   a signal handler that saves a checkpoint *during* the release itself (between the module's
   count and the end of the owners' ``on_round_released``, about a millisecond a round) can
   save an audit state that has counted the round, or part of it, beside a module that has.

An owner's clients go through the module's clipping like real clients: their rows are clipped by
stage 3, and an owner that gives a sum clips its rows through
:meth:`DPFedAvg.clip_virtual_updates <audit_callbacks.federated.DPFedAvg.clip_virtual_updates>`
(a subclass's clipping, or a bug in it, then acts on canaries as on real updates). An owner
whose ``client_updates`` raises ``RuntimeError`` (a row of the wrong shape) is refused with a
``ValueError`` naming the owner and its clients.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from audit_callbacks.federated.round import REAL_CLIENT, Cohort, FederatedRound

if TYPE_CHECKING:  # pragma: no cover
    import lightning.pytorch as pl

__all__ = [
    "REAL_CLIENT", "Cohort", "FederatedAuditHooks", "FederatedRound", "VirtualClientOwner",
    "VirtualClientSumOwner",
]


@runtime_checkable
class VirtualClientOwner(Protocol):
    """The owner of a block of virtual clients (see the module docstring).

    Implement it structurally (any class with this method) or by subclassing; pass the owner to
    :meth:`DPFedAvg.register_virtual_clients
    <audit_callbacks.federated.DPFedAvg.register_virtual_clients>`.
    """

    @abstractmethod
    def client_updates(
        self, fl_round: FederatedRound, indices: np.ndarray, clip_norm: float, out: torch.Tensor,
    ) -> None:
        """Write the updates of this owner's virtual clients ``indices`` ``[m]`` (int64 local
        indices, ``fl_round.cohort.virtual_ids[name]``) into every row of ``out`` ``[m, d]``.

        ``out`` is a view of the round's update matrix, on the device and in the dtype of the
        module's trainable parameters, and not initialised: every row must be written. The
        module clips the rows afterwards, like a real client's. Called once a round, only when
        the owner has clients in it; ``fl_round`` is the sampled round (no updates yet).

        Optional, on the owner: ``on_round_released(fl_round)``, called once per round at the
        round's release (after the server step, before the audit hooks' round end), where an
        owner that counts its clients' participations should count them.

        Raises:
            Whatever it raises; a ``RuntimeError`` (e.g. a row of the wrong shape written into
            ``out``) reaches the caller as a ``ValueError`` naming the owner and the clients.
        """


@runtime_checkable
class VirtualClientSumOwner(VirtualClientOwner, Protocol):
    """An owner that can also give the sum of its clients' clipped updates: the fast path,
    declared by registering with ``register_virtual_clients(..., gives_sum=True)``."""

    @abstractmethod
    def client_update_sum(
        self, fl_round: FederatedRound, indices: np.ndarray, clip_norm: float,
    ) -> torch.Tensor:
        """The sum ``[d]`` of the updates of virtual clients ``indices`` ``[m]``, each clipped as
        the module's clip stage clips a row (call :meth:`DPFedAvg.clip_virtual_updates
        <audit_callbacks.federated.DPFedAvg.clip_virtual_updates>` on the rows), in the dtype
        and on the device of the module's trainable parameters.

        Asked instead of :meth:`client_updates` in a round where nobody needs the rows (no local
        randomizer, no audit callback overriding ``on_federated_client_updates``), at the
        aggregate stage. A sum that is not a finite vector of ``d`` entries raises
        ``ValueError``. For the model to be the same bit for bit either way, the sum must be the
        ``sum(0)`` of the clipped rows :meth:`client_updates` would write.
        """


class FederatedAuditHooks:
    """Base of the callbacks that audit DP-FedAvg's rounds; every hook is a no-op here.

    Subclass it next to Lightning's ``Callback`` (``class MyAudit(FederatedAuditHooks,
    Callback)``) and override the hooks you need. :class:`~audit_callbacks.federated.DPFedAvg`
    calls them on the trainer's callbacks that are instances of this class, between the stages
    of each round (see the module docstring). The update matrix is handed to the hooks whole
    (owners give rows, not sums) when a callback overrides :meth:`on_federated_client_updates`.
    """

    def on_federated_round_start(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        """The round's cohort is sampled (``fl_round.cohort``, ``fl_round.theta``)."""

    def on_federated_client_updates(
        self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound,
    ) -> None:
        """The clipped updates ``fl_round.updates`` ``[n, d]``, before any noise; row ``i`` is the
        client ``fl_round.row_ids[i]`` of ``fl_round.row_owner[i]`` (``REAL_CLIENT`` or an owner
        index, see ``fl_round.real_rows`` and ``fl_round.rows_of(name)``)."""

    def on_federated_randomized_updates(
        self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound,
    ) -> None:
        """Only with a local randomizer: the rows ``fl_round.released`` ``[n, d]`` the clients
        release (same row layout as ``fl_round.updates``)."""

    def on_federated_round_end(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        """After the server step: ``fl_round.model_delta`` ``[d]`` is theta_t - theta_{t-1}."""

