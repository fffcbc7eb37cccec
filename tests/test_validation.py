"""Property tests of the public validators (audit_callbacks.validation): one per validator.

Each property draws from everything a user might pass (integers, floats including NaN and
+-inf, booleans, strings, None, complex numbers, numpy scalars, 0-d and 1-d arrays) and states,
for every draw, either the value returned or that a ValueError names the argument.
"""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit_callbacks import validation as v

settings.register_profile("validators", max_examples=150, deadline=None)
settings.load_profile("validators")

NAME = "some_argument"

not_numbers = st.one_of(
    st.none(), st.text(max_size=5), st.binary(max_size=3), st.complex_numbers(allow_nan=True),
    st.lists(st.integers(), min_size=2, max_size=3), st.just(object()),
    st.just(np.array([1.0, 2.0])), st.just(np.array("3")),
)
bools = st.one_of(st.booleans(), st.sampled_from([np.True_, np.False_]))
ints = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-(2**62), max_value=2**62).map(np.int64),
    st.integers(min_value=0, max_value=2**31).map(np.uint32),
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(np.float32),
    st.floats(allow_nan=True, allow_infinity=True).map(np.float64),
)
anything = st.one_of(ints, floats, bools, not_numbers)


def _names_argument(fn, value, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(value, NAME, *args, **kwargs)
    message = str(info.value)
    assert NAME in message
    return message


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_)
    )


def _float(x: object) -> float:
    """float(x) for a real number (NaN when it is not one or overflows a float)."""
    if not _is_real(x):
        return math.nan
    try:
        return float(x)
    except OverflowError:
        return math.nan


@given(value=anything, minimum=st.integers(min_value=-3, max_value=3))
def test_check_count(value, minimum):
    if _is_int(value) and int(value) >= minimum:
        out = v.check_count(value, NAME, minimum=minimum)
        assert type(out) is int and out == int(value)
    else:  # floats (2.0 included), bools, strings, None, NaN, inf, too small
        message = _names_argument(v.check_count, value, minimum=minimum)
        assert f">= {minimum}" in message


@given(value=st.one_of(st.none(), anything))
def test_check_optional_count(value):
    if value is None:
        assert v.check_optional_count(None, NAME, minimum=1) is None
    elif _is_int(value) and int(value) >= 1:
        assert v.check_optional_count(value, NAME, minimum=1) == int(value)
    else:
        _names_argument(v.check_optional_count, value, minimum=1)


@given(value=anything)
def test_check_seed(value):
    if _is_int(value) and int(value) >= 0:
        assert v.check_seed(value, NAME) == int(value)
        np.random.default_rng(v.check_seed(value, NAME))  # numpy takes every accepted seed
    else:  # True, -1, 0.5, 3.0, inf, "0", None
        _names_argument(v.check_seed, value)


@given(
    value=anything,
    low=st.one_of(st.none(), st.floats(-10, 10)),
    width=st.floats(0, 20),
    low_inclusive=st.booleans(),
    high_inclusive=st.booleans(),
    bounded_above=st.booleans(),
)
def test_check_real(value, low, width, low_inclusive, high_inclusive, bounded_above):
    high = (0.0 if low is None else low) + width if bounded_above else None
    kw = {"low": low, "high": high, "low_inclusive": low_inclusive,
          "high_inclusive": high_inclusive}
    f = _float(value)
    inside = (
        math.isfinite(f)
        and (low is None or (f >= low if low_inclusive else f > low))
        and (high is None or (f <= high if high_inclusive else f < high))
    )
    if inside:
        out = v.check_real(value, NAME, **kw)
        assert type(out) is float and out == f
    else:  # NaN, +-inf, bool, complex, str, None, arrays, out of bounds
        _names_argument(v.check_real, value, **kw)


@given(value=anything)
def test_check_positive(value):
    f = _float(value)
    if math.isfinite(f) and f > 0:
        assert v.check_positive(value, NAME) == f
    else:
        _names_argument(v.check_positive, value)


@given(value=st.one_of(anything, st.floats(0, 1)), lo=st.booleans(), hi=st.booleans())
def test_check_probability(value, lo, hi):
    f = _float(value)
    ok = (0.0 <= f <= 1.0) and (lo or f > 0.0) and (hi or f < 1.0)
    if ok:
        assert v.check_probability(value, NAME, low_inclusive=lo, high_inclusive=hi) == f
    else:
        message = _names_argument(
            v.check_probability, value, low_inclusive=lo, high_inclusive=hi
        )
        if _is_real(value) and math.isfinite(f):  # the interval is stated
            assert ("[" if lo else "(") + "0, 1" + ("]" if hi else ")") in message


@given(value=anything)
def test_check_flag(value):
    if isinstance(value, (bool, np.bool_)):
        out = v.check_flag(value, NAME)
        assert type(out) is bool and out == bool(value)
    else:  # None, 0 / 1, 'yes', NaN
        _names_argument(v.check_flag, value)


@given(value=st.one_of(anything, st.sampled_from(["auto", "fast", "Fast", "auto "])))
def test_check_choice(value):
    choices = ("auto", "fast", "batched")
    if isinstance(value, str) and value in choices:
        assert v.check_choice(value, NAME, choices) == value
    else:
        message = _names_argument(v.check_choice, value, choices)
        assert "'batched'" in message  # the message lists the choices


# ------------------------------------------------------------- domain-specific validators
@given(value=anything)
def test_check_delta_and_alpha(value):
    f = _float(value)
    for fn in (v.check_delta, v.check_alpha):
        if 0.0 < f < 1.0:
            assert fn(value, NAME) == f
        else:
            _names_argument(fn, value)


@given(value=anything)
def test_check_dim(value):
    if _is_int(value) and int(value) >= 2:
        assert v.check_dim(value, NAME) == int(value)
    else:
        _names_argument(v.check_dim, value)


@given(value=st.one_of(anything, st.lists(st.integers(-2, 5), max_size=3).map(tuple)))
def test_check_size(value):
    dims = value if isinstance(value, (tuple, list)) else (value,)
    if all(_is_int(d) and int(d) >= 0 for d in dims):
        assert v.check_size(value, NAME) == tuple(int(d) for d in dims)
    else:
        _names_argument(v.check_size, value)


@given(value=anything)
def test_make_rng(value):
    if value is None or (_is_int(value) and int(value) >= 0):
        assert isinstance(v.make_rng(value, NAME), np.random.Generator)
    else:
        _names_argument(v.make_rng, value)


@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6))
def test_check_finite_1d_and_cosines(values):
    arr = np.asarray(values, dtype=np.float64)
    if arr.size >= 1 and np.all(np.isfinite(arr)):
        assert np.array_equal(v.check_finite_1d(arr, NAME), arr)
        if np.all(np.abs(arr) <= 1.0):
            assert np.array_equal(v.check_cosines(arr, NAME), arr)
        else:
            _names_argument(v.check_cosines, arr)
    else:
        _names_argument(v.check_finite_1d, arr)


# ---------------------------------------------------------------------- fixed examples
@pytest.mark.parametrize("bad", [2.5, 2.0, True, "10", None, math.nan, math.inf, -1, 1j])
def test_count_examples_issue_23(bad):
    with pytest.raises(ValueError, match=re.escape(f"num_canaries must be an integer >= 0, got {bad!r}")):
        v.check_count(bad, "num_canaries")


def test_tensors_are_read_by_their_dtype():
    torch = pytest.importorskip("torch")
    assert v.check_count(torch.tensor(3), NAME) == 3
    assert v.check_real(torch.tensor(0.5, requires_grad=True), NAME) == 0.5
    assert v.check_real(torch.tensor(0.5).to(torch.bfloat16), NAME) == 0.5
    for bad in (torch.tensor(3.0), torch.tensor(True), torch.ones(2, dtype=torch.int64)):
        with pytest.raises(ValueError, match=NAME):
            v.check_count(bad, NAME)
    with pytest.raises(ValueError, match=NAME):
        v.check_real(torch.tensor(True), NAME)


def test_long_values_are_shortened_in_the_message():
    with pytest.raises(ValueError) as info:
        v.check_real(list(range(1000)), NAME)
    assert len(str(info.value)) < 200


def test_huge_integers_are_not_reals_that_overflow():
    with pytest.raises(ValueError, match=NAME):
        v.check_real(10**400, NAME)
    assert v.check_count(10**400, NAME) == 10**400


def test_the_module_imports_no_torch_or_lightning():
    import subprocess

    code = ("import sys, audit_callbacks.validation; "
            "print(sorted(m for m in ('torch', 'lightning', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_private_path_reexports_the_public_checks():
    from audit_callbacks.estimators import _validation

    assert _validation.check_real is v.check_real
    assert _validation.check_count(3, NAME, 1) == 3  # minimum also positional there
    with pytest.raises(ValueError, match=NAME):
        _validation.check_count(0, NAME, 1)


# ----------------------------------------------------------------- issue 26 item 7: datamodules


@pytest.mark.parametrize("kwargs,name", [
    ({"poisson": None}, "poisson"), ({"poisson": "yes"}, "poisson"), ({"poisson": float("nan")}, "poisson"),
    ({"shuffle": 1}, "shuffle"), ({"seed": True}, "seed"), ({"seed": float("inf")}, "seed"),
    ({"seed": -1}, "seed"), ({"batch_size": "10"}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
    ({"val_fraction": 1.0}, "val_fraction"), ({"eval_batch_size": 0}, "eval_batch_size"),
])
def test_central_datamodule_names_the_bad_argument(kwargs, name):
    from datamodules.central import CentralDataModule

    with pytest.raises(ValueError, match=name):
        CentralDataModule("breast_cancer", **kwargs)


@pytest.mark.parametrize("kwargs,name", [
    ({"num_clients": "10"}, "num_clients"), ({"num_clients": 2.5}, "num_clients"),
    ({"seed": True}, "seed"), ({"seed": float("inf")}, "seed"), ({"seed": -1}, "seed"),
    ({"download": "yes"}, "download"), ({"download": None}, "download"),
    ({"rounds_per_epoch": "3"}, "rounds_per_epoch"), ({"test_fraction": float("nan")}, "test_fraction"),
    ({"partition": "dirichlet", "concentration": float("nan")}, "concentration"),
])
def test_federated_datamodule_names_the_bad_argument(kwargs, name):
    from datamodules import FederatedDataModule

    with pytest.raises(ValueError, match=name):
        FederatedDataModule("digits", **kwargs)


@pytest.mark.parametrize("value", [True, float("inf"), -1, 2.5, "3"])
def test_dpsgd_noise_seed_is_an_integer_or_none(value):
    from models import MLP
    from models.dpsgd import DPSGDClassifier

    with pytest.raises(ValueError, match="noise_seed"):
        DPSGDClassifier(MLP(4, 1, hidden=(4,)), noise_seed=value)


def test_label_attack_min_examples_is_a_count():
    from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack

    for cls in (LabelReconstructionAttack, LabelDPLowerBound):
        for value in (0, 2.5, "100", True, None):
            with pytest.raises(ValueError, match="min_examples"):
                cls(min_examples=value)


def test_check_summary_filename():
    for good in ("a.json", "sub/a.json", "..a.json", "sub/../a.json"):
        assert v.check_summary_filename(good) == good
    assert v.check_summary_filename(None) is None
    for bad in (3, b"a.json", "", "  ", "/abs/a.json", "../a.json", "sub/../../a.json", ".", "sub/"):
        with pytest.raises(ValueError, match="summary_filename"):
            v.check_summary_filename(bad)
    with pytest.raises(ValueError, match="out_name"):
        v.check_summary_filename(None, "out_name", optional=False)
