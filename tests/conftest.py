import os
import warnings

import pytest
import torch

os.environ.setdefault("PL_DISABLE_FORK", "1")
torch.set_num_threads(1)  # small models train fastest on one thread; no oversubscription


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        yield


@pytest.fixture
def draws(monkeypatch):
    """Agg drawings per matplotlib figure (id -> count): the tests that a figure is drawn once."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    counts: dict[int, int] = {}
    real = FigureCanvasAgg.draw

    def counting(self):
        counts[id(self.figure)] = counts.get(id(self.figure), 0) + 1
        real(self)

    monkeypatch.setattr(FigureCanvasAgg, "draw", counting)
    return counts


# ------------------------------------------------------------------------------------ slow tests
#: The tests ``make test-fast`` (``pytest -m "not slow"``) leaves out, marked ``slow`` here, in one
#: place: a path (every test of the file) or ``path::test_name`` (every parametrization of it).
#: Subprocesses, DDP, the Flower deployment and simulation, the examples, the screenshots, and
#: the tests that took over ~2 s on 2 shared cores (``pytest --durations=0 -p no:randomly``, a
#: folder at a time). ``make test`` (CI) runs them all.
SLOW: tuple[str, ...] = (
    # whole files: DDP, the Flower deployment and simulation, the screenshots, the examples' runs
    "tests/integration/test_ddp.py",
    "tests/flower/test_flower_deployment.py",
    "tests/callbacks/test_screenshots.py",
    "tests/examples/test_flower_example.py",
    "tests/examples/test_examples_flags.py::test_the_federated_demo_prints_a_number_under_too_few_canaries",
    "tests/examples/test_examples_srr.py",
    "tests/examples/test_examples_dpsgd_label.py",
    "tests/examples/test_examples_ldp_audit.py",
    "tests/canary/test_mechanism_planted.py",
    "tests/callbacks/test_loggers.py",
    # a subprocess, DDP ranks, an example's run
    "tests/auditing/test_auditor.py::test_flower_import_loads_neither_lightning_nor_opacus",
    "tests/auditing/test_html_report.py::test_screenshot_headless_chromium",
    "tests/flower/test_flower.py::test_library_imports_without_flwr",
    "tests/auditing/test_faults.py::test_a_signal_mid_fit_writes_the_interrupted_summary_and_exits_non_zero",
    "tests/auditing/test_faults.py::test_of_several_processes_taking_one_stale_claim_one_wins",
    "tests/canary/test_steps_unknown.py::test_ddp_every_rank_observes_the_same_global_noisy_sum",
    "tests/examples/test_noise_replay.py::test_the_examples_noise_is_not_regenerated_from_its_logs_or_a_rerun",
    "tests/examples/test_examples_accelerator.py::test_demo_runs_on_the_cpu_with_the_flag",
    "tests/examples/test_demo.py::test_make_demo_claims_at_most_10_reads_its_ratio_in_the_planned_range_and_warns_nothing",
    # over ~2 s
    "tests/plain/test_plain_delta.py::test_the_claim_after_make_private_with_epsilon_is_at_its_target",
    "tests/backends/test_opacus_step_ops.py::test_audit_ops_per_step_do_not_grow_with_the_parameter_tensors",
    "tests/backends/test_sampling_advice.py::test_a_lightning_run_on_fixed_size_batches_gets_lightnings_fix",
    "tests/benchmarks/test_ops_per_step.py::test_a_quick_plain_pass_writes_the_budget_check",
    "tests/benchmarks/test_gpu_overhead.py::test_a_tiny_long_fit_on_the_cpu_writes_the_costs_apart",
    "tests/benchmarks/test_watched_coverage.py::test_the_maximum_of_every_logged_series_covers",
    "tests/callbacks/test_canary_audit.py::test_resume_gives_the_same_estimate",
    "tests/callbacks/test_canary_audit_dpsgd.py::test_accountant_untouched_and_validate_after_fit_with_every_callback",
    "tests/callbacks/test_canary_audit_dpsgd.py::test_cached_rdp_epsilon_equals_the_opacus_accountant",
    "tests/callbacks/test_canary_audit_dpsgd.py::test_estimate_separates_loud_from_quiet_noise",
    "tests/callbacks/test_canary_audit_dpsgd.py::test_lightning_gradient_accumulation_charges_canaries_like_the_accountant",
    "tests/callbacks/test_federated_label_attack.py::test_central_noise_lowers_accuracy_as_the_integral_predicts",
    "tests/callbacks/test_label_callbacks.py::test_ghost_norms_equal_the_per_example_gradient_norms",
    "tests/callbacks/test_label_multiclass_callbacks.py::test_digits_mlp_bound_every_step_below_single_step_and_matching_the_attack",
    "tests/canary/test_canaries.py::test_clipping_is_min_one_c_over_norm_times_u",
    "tests/canary/test_hadamard.py::test_fwht_at_every_size_matches_the_definition",
    "tests/canary/test_hadamard.py::test_hadamard_canaries_are_exactly_orthogonal",
    "tests/canary/test_hadamard.py::test_standardized_shift_is_one_over_sigma_for_both_kinds",
    "tests/canary/test_known_rounds.py::test_a_repeated_fit_restarts_the_momentum_recovery",
    "tests/canary/test_known_rounds.py::test_the_recovered_aggregate_is_dpfedavgs_noisy_average",
    "tests/canary/test_steps_unknown.py::test_estimate_tracks_opacus_prv_accountant",
    "tests/estimators/test_estimate_round2_equivalence.py::test_nonnegative_mixture_epsilon_matches_the_nested_root_finding",
    "tests/estimators/test_estimate_round2_equivalence.py::test_normal_limit_interval_coverage_is_unchanged",
    "tests/estimators/test_estimator_speedups.py::test_mixture_epsilon_matches_the_unmerged_computation",
    "tests/estimators/test_estimators_canary_epsilon.py::test_vectorised_bootstrap_reproduces_the_resample_loop",
    "tests/estimators/test_estimators_gaussian.py::test_scalar_two_gaussian_delta_is_the_vectorised_one_bit_for_bit",
    "tests/estimators/test_estimators_lower_bound.py::test_coverage_at_eps_2",
    "tests/estimators/test_estimators_lower_bound.py::test_max_over_thresholds_undercovers_at_small_eps_heldout_does_not",
    "tests/estimators/test_estimators_lower_bound.py::test_pruned_maximum_is_the_full_evaluation",
    "tests/estimators/test_label_dp_client.py::test_known_flipped_clip_factors_give_p1_of_the_attack_and_a_stronger_bound",
    "tests/estimators/test_label_dp_client.py::test_p0_is_the_success_rate_of_the_attack_on_noised_updates",
    "tests/estimators/test_label_dp_multiclass.py::test_never_above_the_single_step_bound_and_the_b9_order",
    "tests/estimators/test_label_dp_multiclass.py::test_ranked_evaluation_gives_the_batch_bound",
    "tests/estimators/test_last_iterate.py::test_delta_matches_monte_carlo",
    "tests/estimators/test_last_iterate.py::test_delta_matches_quadrature",
    "tests/estimators/test_last_iterate.py::test_dpsgd_heuristic_is_at_most_the_accountant",
    "tests/estimators/test_valid_bounds.py::test_coverage_tightest_valid",
    "tests/estimators/test_valid_bounds.py::test_coverage_watched_series_maximum",
    "tests/estimators/test_valid_bounds.py::test_naive_maximum_of_pointwise_bounds_exceeds_and_spending_fixes_it",
    "tests/federated/test_dp_fedavg.py::test_virtual_clients_are_sampled_like_real_ones",
    "tests/federated/test_fedavg_faults.py::test_a_checkpoint_saved_mid_round_resumes_to_the_uninterrupted_counts",
    "tests/flower/test_flower.py::test_client_side_clipping_and_unequal_weights",
    "tests/flower/test_flower.py::test_failures_and_bad_replies_are_skipped_not_nan",
    "tests/flower/test_flower.py::test_large_noise_estimate_falls_toward_zero",
    "tests/flower/test_flower.py::test_no_noise_canaries_stand_out",
    "tests/flower/test_flower.py::test_participations_are_binomial",
    "tests/flower/test_flower.py::test_resume_equals_uninterrupted",
    "tests/flower/test_flower.py::test_summary_and_tensorboard",
    "tests/flower/test_flower_crosscheck.py::test_flower_and_dpfedavg_estimates_agree",
    "tests/flower/test_flower_faults.py::test_a_bad_num_examples_skips_the_reply",
    "tests/flower/test_flower_faults.py::test_a_killed_node_gives_the_effective_noise_multiplier",
    "tests/flower/test_flower_faults.py::test_no_logged_seed_replays_the_dp_wrappers_noise",
    "tests/integration/test_label_opacus_lightning_fixture.py::test_at_the_scripts_own_logging_interval_each_epoch_is_still_measured",
    "tests/integration/test_label_opacus_lightning_fixture.py::test_label_callbacks_complete_the_fit_and_log_a_measurement_or_a_reason",
    "tests/integration/test_opacus_example_port.py::test_all_three_callbacks_complete_the_example",
    "tests/integration/test_opacus_example_port.py::test_resume_test_csv_and_no_logger",
    "tests/integration/test_opacus_example_port.py::test_the_example_with_a_canary_audit_in_tensorboard",
    "tests/integration/test_users_scripts.py::test_a_repeated_fit_continues_the_audit_and_the_accountant",
    "tests/integration/test_users_scripts.py::test_opacus_script_of_either_namespace_gets_every_tensorboard_extra",
    "tests/integration/test_users_scripts.py::test_other_opacus_entry_points_give_the_accountants_epsilon",
    "tests/integration/test_users_scripts.py::test_resume_restores_the_accountant",
    "tests/plain/test_plain_pytorch.py::test_the_mnist_port_audits",
    "tests/test_validation.py::test_central_datamodule_names_the_bad_argument",
)


def _slow_rules() -> dict[str, set[str] | None]:
    rules: dict[str, set[str] | None] = {}
    for entry in SLOW:
        path, _, name = entry.partition("::")
        if not name:
            rules[path] = None
        elif rules.get(path, set()) is not None:
            rules.setdefault(path, set()).add(name)  # type: ignore[union-attr]
    return rules


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark the ``SLOW`` tests; a ``SLOW`` entry that names no test of a file collected whole
    is an error (a renamed test would otherwise silently join the fast run)."""
    rules = _slow_rules()
    seen: dict[str, set[str]] = {}
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        name = rest.split("[")[0].split("::")[-1]
        seen.setdefault(path, set()).add(name)
        if path in rules and (rules[path] is None or name in rules[path]):
            item.add_marker(pytest.mark.slow)
    stale = sorted(f"{path}::{name}" for path, names in rules.items() if path in seen and names
                   for name in names - seen[path])
    subset = config.option.keyword or config.option.deselect or getattr(config.option, "lf", False) or any(
        "::" in str(arg) for arg in config.args)
    if stale and not subset:
        raise pytest.UsageError("tests/conftest.py SLOW names tests that do not exist: " + ", ".join(stale))
