"""Where Opacus draws its DP noise from: replayable after seed_everything, from an unseeded or
publicly seeded noise_generator, not from one seeded with OS entropy (real make_private)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from opacus import PrivacyEngine

from audit_callbacks.backends.opacus.noise_source import (
    NEW_GENERATOR_SEED,
    noise_source,
    public_seed,
)


def _optimizer(**kwargs):
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    _, opt, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=loader,
        noise_multiplier=1.0, max_grad_norm=1.0, **kwargs)
    return opt


def test_seed_everything_makes_the_global_noise_replayable(monkeypatch):
    import lightning

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # recorded, so that the teardown restores it
    monkeypatch.delenv("PL_GLOBAL_SEED")
    lightning.seed_everything(42, verbose=False)
    found = noise_source(_optimizer())
    assert found.kind == "global generator" and found.replayable
    assert "seed_everything" in found.message and "secure_mode=True" in found.message
    assert "42" not in found.message  # the seed itself is never written


def test_an_unseeded_or_public_noise_generator_is_replayable():
    assert noise_source(_optimizer(noise_generator=torch.Generator())).replayable
    assert "never seeded" in noise_source(_optimizer(noise_generator=torch.Generator())).message
    assert noise_source(_optimizer(noise_generator=torch.Generator().manual_seed(7))).replayable


def test_a_generator_seeded_from_os_entropy_is_not_replayable():
    seed = int.from_bytes(os.urandom(8), "little") | (1 << 40)  # a 64-bit seed
    found = noise_source(_optimizer(noise_generator=torch.Generator().manual_seed(seed)))
    assert found.kind == "own generator" and not found.replayable and found.message is None
    assert noise_source(object.__new__(type("Opt", (), {"generator": torch.Generator(),
                                                         "secure_mode": True,
                                                         "params": []}))).kind == "secure"


def test_a_logged_seed_is_public():
    seed = (1 << 50) + 12345
    opt = _optimizer(noise_generator=torch.Generator().manual_seed(seed))
    assert not noise_source(opt).replayable
    assert noise_source(opt, logged_seeds=[seed]).replayable
    assert public_seed(NEW_GENERATOR_SEED) and public_seed(41) and not public_seed(seed)


def test_a_fresh_process_draws_from_os_entropy():
    """Without any seeding, torch's global generator starts from OS entropy: not replayable."""
    code = ("import torch\n"
            "from audit_callbacks.backends.opacus.noise_source import noise_source\n"
            "opt = type('Opt', (), {'generator': None, 'secure_mode': False, 'params': [torch.zeros(1)]})()\n"
            "print(noise_source(opt).replayable)")
    env = {k: v for k, v in os.environ.items() if k != "PL_GLOBAL_SEED"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, cwd=os.getcwd())
    # a 64-bit entropy seed falls below 2^32 with probability 2^-32
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_noise_reads_the_device_generator():  # pragma: no cover - GPU only
    torch.cuda.manual_seed_all(3)
    opt = type("Opt", (), {"generator": None, "secure_mode": False, "params": [torch.zeros(1, device="cuda")]})()
    assert noise_source(opt).replayable


def test_the_audits_own_seed_marks_batches_known_without_naming_it() -> None:
    """torch's global generator seeded with the audit's canary seed: the batches replay, and the
    text says so without the number (which would tell the training's seed); a seed the training
    logged itself is named (it is in the logs already)."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    from audit_callbacks.backends.opacus.noise_source import batch_source

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.zeros(40, 2)),
        batch_sampler=UniformWithReplacementSampler(num_samples=40, sample_rate=0.1))
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(54321)
        audit_seed = batch_source(loader, logged_seeds=[], public_seeds=[54321])
        logged = batch_source(loader, logged_seeds=[54321])
    finally:
        torch.random.set_rng_state(state)
    assert audit_seed.known and "54321" not in audit_seed.sampling
    assert audit_seed.sampling.startswith("known:")
    assert logged.known and "reproducible from seed 54321" in logged.sampling
