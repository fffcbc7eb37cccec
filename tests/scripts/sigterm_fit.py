"""A long DP-FedAvg fit with ``CanaryAudit``, for ``tests/auditing/test_faults.py`` to stop with a signal.

The run writes ``<out>/started`` once a few rounds were taken, then goes on (slowly) for far
longer than the test waits; the test sends SIGTERM (or SIGINT) and checks the exit code and the
summary the audit wrote (``<out>/audit/version_0/audit_summary.json``).

Usage: ``python sigterm_fit.py --out DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from audit_callbacks.callbacks import CanaryAudit  # noqa: E402
from tests._federated import digits_dpfedavg  # noqa: E402

warnings.filterwarnings("ignore")


class Started(Callback):
    """Writes ``path`` after ``after`` rounds; every round then takes ``pause`` seconds."""

    def __init__(self, path: str, after: int = 4, pause: float = 0.02) -> None:
        self.path, self.after, self.pause = path, after, pause

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.after:
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write(str(trainer.global_step))
        time.sleep(self.pause)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    dm, module = digits_dpfedavg(rounds_per_epoch=10_000)
    audit = CanaryAudit(10, 20, bootstrap=0, log_figures=False, log_histograms=False)
    trainer = pl.Trainer(max_steps=100_000, max_epochs=-1, logger=False, accelerator="cpu",
                         callbacks=[audit, Started(os.path.join(args.out, "started"))],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=args.out)
    trainer.fit(module, datamodule=dm)


if __name__ == "__main__":
    main()
