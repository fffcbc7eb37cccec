"""The advice for a training loader that is not Opacus' Poisson ``DPDataLoader``, per front end:
a plain loop trains on the loader ``make_private(..., poisson_sampling=True)`` returns, while
Lightning trains on ``train_dataloader``'s and ignores the one ``make_private`` returns, so
there the fix is ``DPDataLoader.from_data_loader`` in ``train_dataloader``."""

from __future__ import annotations

import warnings

import pytest

from audit_callbacks.backends.opacus.backend import sampling_warning

REASON = ("the training loader's batch sampler is BatchSampler, not Opacus' Poisson "
          "UniformWithReplacementSampler (DPDataLoader)")


def test_lightnings_advice_is_the_dataloader_not_make_private():
    said = sampling_warning("CanaryAudit", REASON)
    assert said.startswith("CanaryAudit: canaries are drawn by the audit")
    assert "Return DPDataLoader.from_data_loader(loader) from the LightningModule's (or datamodule's) train_dataloader" in said
    assert "poisson_sampling=True changes nothing here" in said
    assert "Pass poisson_sampling=True" not in said


def test_a_plain_loops_advice_is_make_privates_loader():
    said = sampling_warning("OpacusCanaryAudit", REASON)
    assert said.startswith("OpacusCanaryAudit: canaries are drawn by the audit")
    assert "Pass poisson_sampling=True to make_private and train on the loader it returns" in said
    assert "train_dataloader" not in said


@pytest.mark.slow
def test_a_lightning_run_on_fixed_size_batches_gets_lightnings_fix(tmp_path):
    """Lightning, make_private in configure_optimizers, a fixed-size loader over 3 epochs: the
    sampling warning gives Lightning's fix, and the verdict says fixed-size batches (each epoch
    ends with a short batch) with the tests that rejected them, and both front ends' fixes."""
    from audit_callbacks.callbacks import CanaryAudit
    from tests.callbacks.test_canary_audit_dpsgd import _fit

    audit = CanaryAudit(num_canaries=32, seed=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _fit(tmp_path, [audit], epochs=3, poisson=False, logger=False)
    said = [str(w.message) for w in record if "drawn by the audit" in str(w.message)]
    assert said and "DPDataLoader.from_data_loader(loader)" in said[0], said
    assert "Pass poisson_sampling=True" not in said[0]
    word, sentence = audit.report().mechanism_verdict()
    assert word == "unproven", sentence
    # 455 examples: 7 batches of 64 and one of 7 an epoch, 3 short ones in 24 steps
    assert "the loader draws fixed-size batches of 64; rejected by" in sentence, sentence
    assert "the repeats test: size 64 in 21 of 24 steps" in sentence, sentence
    assert "DPDataLoader.from_data_loader(loader) from train_dataloader" in sentence
