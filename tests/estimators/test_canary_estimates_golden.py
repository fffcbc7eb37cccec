"""``canary_estimates`` bit for bit: every estimate, bound, interval, status and detail of the
seeded score sets of :mod:`tests.estimators.golden_canary_estimates`, as the code gave them before
the estimates were made cheaper (``golden/canary_estimates.json``, floats as
``float.hex``), and the DP-FedAvg plans' fields the same way. A speed-up that moves any number by
one ulp fails here."""

from __future__ import annotations

import json

import pytest

from audit_callbacks.estimators.canary_report import canary_estimates
from tests.estimators.golden_canary_estimates import (
    PATH,
    canonical,
    cases,
    plan_canonical,
    plan_cases,
)

with open(PATH, encoding="utf-8") as _fh:
    GOLDEN = json.load(_fh)


@pytest.mark.parametrize("name", sorted(cases()))
def test_canary_estimates_bit_for_bit(name: str) -> None:
    args, kwargs = cases()[name]
    assert canonical(canary_estimates(*args, **kwargs)) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(plan_cases()))
def test_fedavg_plan_bit_for_bit(name: str) -> None:
    assert plan_canonical(plan_cases()[name]) == GOLDEN[name]


def test_golden_covers_every_case() -> None:
    assert sorted(GOLDEN) == sorted([*cases(), *plan_cases()])
