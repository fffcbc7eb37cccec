"""The report a person reads: the number to read first, the ratio read against the plan, the
epsilon scale with its source, figure titles in words and the chance level of a label section."""

import pytest

from audit_callbacks import names
from audit_callbacks.auditing.html_report import (
    EPSILON_SCALE_SOURCE,
    epsilon_tier,
    render_html,
    render_markdown,
)


def _summary(ratio: float = 0.60) -> dict:
    est = {"value": 2.9, "lower": 2.5, "upper": 3.3, "status": "ok"}
    return {
        "callback": "CanaryAudit", "source": "src", "inputs": {"training": "Opacus DP-SGD", "delta": 1e-5},
        "estimates": {names.EPSILON_ALL_ITERATES: est, names.EPSILON_FINAL_MODEL: dict(est)},
        names.EPSILON_ANALYTIC: 4.8, names.EPSILON_RATIO_ALL_ITERATES: ratio,
        names.PLAN_STATUS: "ok", names.PLAN_RATIO_LOW: 0.86, names.PLAN_RATIO_HIGH: 1.04,
        names.PLAN_RATIO_READING: f"{ratio:.2f}: below the range expected for a correct run at these "
                                  "settings [0.86, 1.04]: the audit is weaker than planned",
        names.PLAN_SENTENCE: "plan: k = 455 canaries can show a valid epsilon of at most 8.33",
    }


@pytest.mark.parametrize("render", ["html", "md"])
def test_the_number_to_read_comes_first_with_the_plan_and_the_scale(render: str) -> None:
    summary = _summary()
    page = render_html(summary, {}) if render == "html" else render_markdown(summary)
    first = page.index("the number to read")
    assert first < page.index("Verdict") < page.index("Headline numbers")
    assert page.index("epsilon_all_iterates = 2.9") > first
    assert "0.60: below the range expected for a correct run" in page
    assert "plan: k = 455 canaries" in page
    assert "Ponomareva et al." in page and "JAIR 77 (2023)" in page  # the scale's source
    assert "4.8: reasonable formal privacy guarantee" in page  # the claim on the scale
    # the estimate is placed on the scale but never called a guarantee (it is not one)
    assert "2.9: at most 10 (an empirical estimate, not a guarantee)" in page
    assert "2.9: reasonable formal privacy guarantee" not in page


def test_epsilon_tiers() -> None:
    assert epsilon_tier(0.5).startswith("strong") and epsilon_tier(1.0).startswith("strong")
    assert epsilon_tier(6.9).startswith("reasonable") and epsilon_tier(10.0).startswith("reasonable")
    assert epsilon_tier(649.0).startswith("weak to no") and epsilon_tier(None) is None
    assert "tiers at epsilon 1 and 10" in EPSILON_SCALE_SOURCE


def test_label_section_shows_its_chance_level() -> None:
    extra = {"label reconstruction attack": {names.ACCURACY: 0.0885, "num_classes": 10, "status": "ok"}}
    page = render_html(_summary(), {}, extra)
    md = render_markdown(_summary(), extra=extra)
    for text in (page, md):
        assert "chance level: 1 / 10 = 0.1" in text
        assert "at or below it: the attack recovers no label beyond guessing" in text
    above = render_html(None, {}, {"label": {names.ACCURACY: 0.5, "num_classes": 10}})
    assert "5.0 times it" in above
