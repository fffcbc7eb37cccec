"""A LightningModule trained with Opacus DP-SGD, ``make_private`` in ``configure_optimizers``
(the usual Lightning pattern, as in Opacus' own Lightning example)."""

from __future__ import annotations

import secrets
import warnings
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch import nn
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy

from audit_callbacks.validation import (
    check_choice,
    check_delta,
    check_flag,
    check_positive,
    check_real,
    check_seed,
)

__all__ = ["DPSGDClassifier"]


class DPSGDClassifier(L.LightningModule):
    """Classifier trained with DP-SGD. One logit (the model returns ``[N, 1]`` or ``[N]``) uses a
    sigmoid and log-loss (paper 004's setting); K >= 2 logits use softmax cross-entropy. Which
    one is read from the logits the model returns on its first batch, whatever the order its
    layers were registered in.

    Args:
        model: the network, ``[N, D] -> [N, K]`` logits (K = 1, or ``[N]``, for binary).
        lr: SGD learning rate.
        noise_multiplier: sigma; 0 gives clipping only.
        max_grad_norm: per-example clip norm C.
        delta: the delta of the logged epsilon.
        accountant: "rdp" or "prv" (Opacus).
        dp: False trains without Opacus (plain SGD), for baselines.
        poisson: tell ``make_private`` the loader already samples Poisson batches.
        noise_seed: None (default, secure): Opacus' noise comes from a ``torch.Generator``
            seeded with 63 bits of OS entropy (:func:`secrets.randbits`) at every
            ``configure_optimizers``; the seed is never stored, logged or checkpointed, so no
            logged seed (``seed_everything``, the canaries' seed, the data seed) and no
            checkpoint regenerates the noise. An integer: REPRODUCIBLE ONLY, NEVER FOR REAL
            PRIVACY (anyone who knows the seed can subtract the noise): one generator seeded
            with it serves every fit of this module (a second ``configure_optimizers`` continues
            its stream), and its state is saved in the checkpoint (``"dpsgd_noise_generator"``)
            so that a resumed fit continues the stream exactly where it stopped (the draws of
            an interrupted and resumed fit equal an uninterrupted one's; no step's noise is
            drawn twice). Opacus' own ``secure_mode`` needs ``torchcsprng``, which has no build
            for torch >= 2.1; the OS-entropy seed is this module's secure mode.

    Logs ``val/loss``, ``val/accuracy`` (torchmetrics, held-out data) and ``privacy/epsilon``
    (the accountant's epsilon at ``delta``, every training epoch). No training loss is logged:
    the mean of the un-noised losses over the secret Poisson batches is a release the DP
    guarantee does not cover (docs/security.md).

    Raises:
        ValueError: naming the argument: ``lr`` or ``max_grad_norm`` not a finite real > 0,
            ``noise_multiplier`` not one >= 0, ``delta`` outside (0, 1), ``accountant`` not one
            of Opacus' ("rdp", "gdp", "prv"), ``dp`` not a bool, ``noise_seed`` neither None
            nor an integer >= 0.
    """

    def __init__(
        self, model: nn.Module, *, lr: float = 0.1, noise_multiplier: float = 1.0,
        max_grad_norm: float = 1.0, delta: float = 1e-5, accountant: str = "rdp", dp: bool = True,
        noise_seed: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.lr = check_positive(lr, "lr")
        self.noise_multiplier = check_real(noise_multiplier, "noise_multiplier", low=0.0)
        self.max_grad_norm = check_positive(max_grad_norm, "max_grad_norm")
        self.delta = check_delta(delta)
        self.accountant_name = check_choice(accountant, "accountant", ("rdp", "gdp", "prv"))
        self.dp_enabled = check_flag(dp, "dp")
        self.noise_seed = None if noise_seed is None else check_seed(noise_seed, "noise_seed")
        # read from the logits' width on the first batch (a layer's registration order says
        # nothing of which layer gives the output)
        self.binary: bool | None = None
        self.val_acc: BinaryAccuracy | MulticlassAccuracy | None = None
        self.privacy_engine: PrivacyEngine | None = None
        self._dp: dict[str, Any] = {}
        self._noise_gen: torch.Generator | None = None  # reproducible mode only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _is_binary(self, logits: torch.Tensor) -> bool:
        if self.binary is None:
            self.binary = logits.dim() == 1 or logits.shape[-1] == 1
        return self.binary

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._is_binary(logits):
            return F.binary_cross_entropy_with_logits(logits.reshape(-1), y.float())
        return F.cross_entropy(logits, y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        # returned to the optimizer only, never logged (an un-noised statistic of the batch)
        return self._loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", self._loss(logits, y), batch_size=len(y))
        if self.val_acc is None:
            self.val_acc = (BinaryAccuracy() if self.binary else
                            MulticlassAccuracy(num_classes=logits.shape[-1], average="micro")).to(logits.device)
        pred = logits.reshape(-1) if self.binary else logits
        self.val_acc(pred, y)
        self.log("val/accuracy", self.val_acc, batch_size=len(y), metric_attribute="val_acc")

    def on_train_epoch_end(self) -> None:
        if self.privacy_engine is not None and self.privacy_engine.accountant.history:
            self.log("privacy/epsilon", float(self.privacy_engine.get_epsilon(self.delta)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        if not self.dp_enabled:
            return optimizer
        self.trainer.fit_loop.setup_data()
        loader = self.trainer.train_dataloader
        if "model" in self._dp:  # configure_optimizers called again (a new fit): one set of hooks
            self._dp["model"].remove_hooks()
        self.privacy_engine = PrivacyEngine(accountant=self.accountant_name)
        gen = self._noise_generator(next(self.model.parameters()).device)
        dp_model, optimizer, _ = self.privacy_engine.make_private(
            module=self.model, optimizer=optimizer, data_loader=loader,
            noise_multiplier=self.noise_multiplier, max_grad_norm=self.max_grad_norm,
            poisson_sampling=False, noise_generator=gen,
        )
        self._dp["model"] = dp_model  # in a dict: not registered as a submodule
        return optimizer

    NOISE_STATE_KEY = "dpsgd_noise_generator"

    def _noise_generator(self, device: torch.device) -> torch.Generator:
        """The generator of Opacus' noise on ``device`` (see ``noise_seed``).

        Secure (``noise_seed=None``): a fresh generator seeded with 63 bits of OS entropy, held
        only by the optimizer. Reproducible: this module's one generator, created from
        ``noise_seed`` on first use and kept (a later call continues its stream; on another
        device the stream restarts from a seed derived from ``(noise_seed, draws so far)``).
        """
        if self.noise_seed is None:
            return torch.Generator(device=device).manual_seed(secrets.randbits(63))
        gen = self._noise_gen
        if gen is None or gen.device != torch.device(device):
            old = gen
            gen = torch.Generator(device=device)
            gen.manual_seed(self.noise_seed if old is None else _derived_seed(self.noise_seed, old.initial_seed(),
                                                                              int(self.global_step)))
            self._noise_gen = gen
        return gen

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Reproducible mode: save the noise generator's state (the secure one is never saved)."""
        if self.noise_seed is not None and self._noise_gen is not None:
            checkpoint[self.NOISE_STATE_KEY] = {"device": self._noise_gen.device.type,
                                                "state": self._noise_gen.get_state()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Reproducible mode: continue the saved noise stream (Lightning loads the checkpoint
        before ``configure_optimizers``). A checkpoint without the state (secure run, older
        version) gets a stream derived from ``(noise_seed, global_step)`` with a warning, never
        the stream of step 1 again."""
        if self.noise_seed is None:
            return
        saved = checkpoint.get(self.NOISE_STATE_KEY)
        if isinstance(saved, dict) and isinstance(saved.get("state"), torch.Tensor):
            gen = torch.Generator(device=str(saved.get("device", "cpu")))
            gen.set_state(saved["state"])
            self._noise_gen = gen
            return
        step = int(checkpoint.get("global_step", 0))
        warnings.warn(f"DPSGDClassifier(noise_seed=...): the checkpoint holds no noise generator state; "
                      f"the resumed noise stream is derived from (noise_seed, global_step={step})",
                      UserWarning, stacklevel=2)
        self._noise_gen = torch.Generator().manual_seed(_derived_seed(self.noise_seed, 0, step))


def _derived_seed(*words: int) -> int:
    """A 63-bit seed from integers (numpy's SeedSequence): distinct inputs, unrelated streams."""
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, np.uint64)[0] >> np.uint64(1))
