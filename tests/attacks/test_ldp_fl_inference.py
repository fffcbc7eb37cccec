import math

import numpy as np
import pytest
import torch

from audit_callbacks.attacks.ldp_fl_inference import LDPFLInferenceAttack, two_point_prediction
from audit_callbacks.mechanisms import TwoPoint


def test_eq2_inverts_the_two_point_probability():
    # p = P(high output | w) from eq. 1; eq. 2 applied to the exact p returns w
    eps, c, r = 1.5, 0.2, 0.5
    e = math.exp(eps)
    w = np.linspace(c - r, c + r, 11)
    p = ((w - c) * (e - 1) + r * (e + 1)) / (2 * r * (e + 1))
    assert np.allclose(two_point_prediction(p, eps, c, r), w, atol=1e-12)


@pytest.mark.parametrize("eps", [1.0, 5.0])
def test_prediction_error_matches_its_sampling_law(eps):
    # Clients' weights ~ N(w, 0.01^2) around w = 0.3 on [-1, 1]; 100 clients, 50 rounds.
    c, r, n, rounds, w = 0.0, 1.0, 100, 50, 0.3
    mech = TwoPoint(eps, center=c, radius=r)
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    errors = []
    for rep in range(40):
        attack = LDPFLInferenceAttack(c, r, seed=rep)
        truth = []
        for _ in range(rounds):
            weights = torch.as_tensor(rng.normal(w, 0.01, size=(n, 1)), dtype=torch.float64)
            truth.append(weights.mean().item())
            attack.observe(mech.randomize(weights, generator=gen).numpy())
        errors.append(attack.predict(target=np.mean(truth)).error[0])
    # eq. 2 is the mean of N = n * rounds two-point outputs: sd = sqrt(Var) / sqrt(N) with
    # Var = B^2 - w^2 (outputs +-B, B = r (e+1)/(e-1)); E|error| = sqrt(2/pi) sd / (2r)
    e = math.exp(eps)
    big = r * (e + 1) / (e - 1)
    expected = math.sqrt(2 / math.pi) * math.sqrt(big**2 - w**2) / math.sqrt(n * rounds) / (2 * r)
    mean_err = float(np.mean(errors))
    # 40 repetitions of a half-normal: relative sd of the mean ~ 0.76 / sqrt(40) = 12%
    assert mean_err == pytest.approx(expected, rel=0.4)


def test_confidence_rises_with_rounds_and_bad_input():
    mech = TwoPoint(2.0)
    gen = torch.Generator().manual_seed(1)
    attack = LDPFLInferenceAttack(0.0, 1.0, seed=0)
    with pytest.raises(RuntimeError):
        attack.predict()
    attack.observe(mech.randomize(torch.full((200, 3), 0.4, dtype=torch.float64), generator=gen).numpy())
    first = attack.predict()
    assert first.confidence is None and first.prediction.shape == (3,)
    scores = []
    for _ in range(60):
        attack.observe(mech.randomize(torch.full((200, 3), 0.4, dtype=torch.float64), generator=gen).numpy())
        scores.append(attack.predict().confidence.mean())
    assert np.mean(scores[-10:]) > np.mean(scores[:10])
    assert all(0 < s <= 100 for s in scores)
    with pytest.raises(ValueError):
        attack.observe(np.ones((5, 4)))
    with pytest.raises(ValueError):
        attack.observe(np.array([np.nan]))
    with pytest.raises(ValueError):
        LDPFLInferenceAttack(0.0, 0.0)


def test_attack_state_roundtrip_equals_uninterrupted():
    import numpy as np

    from audit_callbacks.attacks import LDPFLInferenceAttack

    rng = np.random.default_rng(0)
    rows = [rng.uniform(-1, 1, size=(5, 7)) for _ in range(6)]
    full = LDPFLInferenceAttack(0.0, 1.0, seed=3)
    for r in rows:
        full.observe(r)
    half = LDPFLInferenceAttack(0.0, 1.0, seed=3)
    for r in rows[:3]:
        half.observe(r)
    resumed = LDPFLInferenceAttack(0.0, 1.0, seed=3)
    resumed.load_state_dict(half.state_dict())
    for r in rows[3:]:
        resumed.observe(r)
    a, b = full.predict(), resumed.predict()
    assert np.array_equal(a.prediction, b.prediction) and np.array_equal(a.confidence, b.confidence)
    assert np.array_equal(a.prediction_1, b.prediction_1)  # the random halves too (rng state)
