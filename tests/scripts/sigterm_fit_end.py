"""A short fit that is killed by SIGTERM in the fit-end window, for ``tests/auditing/test_faults.py``.

Lightning restores the default SIGTERM handler in its teardown, before ``on_fit_end``: a signal
there ends the process at once (no ``on_exception``). The first callback here sends SIGTERM to
its own process in ``on_fit_end``, before the audits' ``on_fit_end`` runs; the test checks the
summaries the audits wrote before (at ``on_train_end``).

Usage: ``python sigterm_fit_end.py --out DIR --run dpsgd|federated|ldp``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

warnings.filterwarnings("ignore")


class KillAtFitEnd(Callback):
    """SIGTERM to this process in the window between Lightning's teardown and the audits'
    ``on_fit_end`` (the default handler is back: the process ends at once)."""

    def on_fit_end(self, trainer: pl.Trainer, pl_module: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--run", required=True, choices=["dpsgd", "federated", "ldp"])
    args = parser.parse_args(argv)
    from audit_callbacks.callbacks import CanaryAudit, LabelDPLowerBound, LabelReconstructionAttack
    from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
    from audit_callbacks.callbacks.ldp_audit import LDPAudit
    from audit_callbacks.callbacks.ldp_inference import LDPInferenceAudit
    from audit_callbacks.federated import DPFedAvg
    from audit_callbacks.mechanisms import TwoPoint
    from datamodules import FederatedDataModule
    from datamodules.central import CentralDataModule
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    if args.run == "dpsgd":
        dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
        module = DPSGDClassifier(MLP(30, 1, hidden=(16,)), lr=0.3, noise_multiplier=1.0, max_grad_norm=1.0)
        audits = [CanaryAudit(10, 20, bootstrap=0, log_figures=False), LabelReconstructionAttack(), LabelDPLowerBound()]
    else:
        dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=6, seed=0)
        dm.setup("fit")
        randomizer = TwoPoint(2.0, center=0.0, radius=0.2) if args.run == "ldp" else None
        module = DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.5 if randomizer is None
                          else 0.0, clip_norm=1.0, local_lr=0.5, local_batch_size=1000, sampling="shuffle",
                          randomizer=randomizer, client_datasets=dm.client_datasets)
        audits = [LDPAudit(), LDPInferenceAudit()] if randomizer is not None else [
            CanaryAudit(10, 20, bootstrap=0, log_figures=False), FederatedLabelAttack()]
    trainer = pl.Trainer(max_steps=6, max_epochs=-1, logger=TensorBoardLogger(args.out, name="run", version=0),
                         callbacks=[KillAtFitEnd(), *audits], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1, accelerator="cpu")
    trainer.fit(module, datamodule=dm)


if __name__ == "__main__":
    main()
