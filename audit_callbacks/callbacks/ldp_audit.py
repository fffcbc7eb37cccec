"""``LDPAudit``: the empirical epsilon-0 test of a client randomizer, inside a DP-FedAvg run.

"Measuring Local and Shuffled Privacy of Gradient Randomized Response" (Alg. 2, Table 2, §4.4, Figure 4) and Matsumoto, Takahashi, Liew & Oguchi (its workshop version, Table 1); docs/methods/ldp.md, C1-C3. Attach it to
a ``Trainer`` that fits :class:`~audit_callbacks.federated.DPFedAvg` with ``randomizer=...``.
Every ``every_n_rounds`` rounds, and at fit end, it plays the distinguishing game of
:func:`~audit_callbacks.attacks.ldp_epsilon_test` against the run's OWN randomizer, once per
crafting adversary, with pairs (g1, g2) built by :func:`~audit_callbacks.attacks.craft_pair` from
the current global model and one randomly chosen client's data (secret by default, below):

=============  ===========================================================================
benign         gradients of two random examples of the client
label_flip     one example with its label and with another random label
gradient_flip  gradient of a random example, g2 = -g1 (reaches eps0 only if |g1| >= L)
collusion      gradient under a server model trained on the client's most frequent label,
               for an example of another label (large norm); g2 = -g1
dummy          (L/sqrt(d), ..., L/sqrt(d)), g2 = -g1 (LDP-SGD's worst case)
=============  ===========================================================================

Gradients are flat over the model's trainable parameters (the vectors DP-FedAvg randomizes);
L is the randomizer's ``clip_norm`` (else the module's). LDP-SGD runs on the exact O(1) fast path
(docs/methods/ldp.md, C3); any other randomizer on the batched full-vector path.

Logged (step = the round), through every attached logger; every tag is
``names.tag("ldp", name)`` (:mod:`audit_callbacks.names`) and a per-adversary tag is the record's
key followed by ``_<adversary>``:

* ``ldp/epsilon0_<adversary>``: the eq.-3 point estimate (capped at the ceiling when a rate is 0);
* ``ldp/epsilon0_lower_bound_<adversary>``: its one-sided (1 - alpha) Clopper-Pearson lower bound;
* ``ldp/epsilon0_claimed``: what the randomizer claims for one release of a whole d-dim row
  (``epsilon_for_dim(d)``: eps0 for LDP-SGD, d * eps for per-coordinate mechanisms);
* ``ldp/epsilon0_ceiling``: the largest lower bound this audit's tests could show: the largest
  over its adversaries of the zero-error bound of the test's realised group sizes (each test
  splits its trials at random, so this moves around
  :func:`~audit_callbacks.attacks.measurable_ceiling` ``(trials, alpha)``, the nominal split's);
  no lower bound logged at that step is above it (a point estimate from small nonzero error
  rates can be);
* ``ldp/clip_norm``: L;
* ``ldp/client_updates_at_clip``: the share of real clients' updates (so far) that DP-FedAvg
  clipped to its clip norm, i.e. whose raw norm was at least the clip norm;
* for discrete per-coordinate mechanisms, once at step 0: ``ldp/epsilon_exact_per_coordinate``
  (exact audit by enumeration, :func:`~audit_callbacks.mechanisms.exact_epsilon_witness`; +inf
  when an output is impossible under one input) and ``ldp/epsilon_claimed_per_coordinate``.

The Custom Scalars layout comes from :func:`audit_callbacks.names.chart_layout`: one chart holds
the estimates, lower bounds, the claimed eps0 and the ceiling; another ``val/accuracy`` (logged by
DP-FedAvg); a third L.

Summary (``audit_summary``, written at fit end): each audit's epsilon0 with its lower and upper
bounds, and its family-wise lower bound, is an
:class:`~audit_callbacks.estimators.result.AuditResult` (``to_dict()``) under the same name as
its tag; so is the exact audit.

Broken randomizer. The logged lower bound is a per-test (1 - alpha) bound: a correct randomizer
has it above its true epsilon in up to alpha of the tests, so flagging on it would flag correct
randomizers in long runs. The flag uses a family-wise bound instead: the k-th audit's tests use
``alpha_k = alpha / (A k (k + 1))`` for A adversaries (:func:`familywise_alpha`; the alpha_k sum
to alpha over all audits), so over the WHOLE run a correct randomizer is flagged with probability
at most alpha. For a randomizer with delta > 0 the bound accounts for delta (Kairouz et al. 2015:
``log((1 - delta - FPR)/FNR)``, :func:`flag_lower_bound`). When the family-wise lower bound exceeds
the claimed eps0 (relative tolerance 1e-9), or the exact audit exceeds the claimed per-coordinate
epsilon, the callback warns (:class:`BrokenRandomizerWarning`, once per adversary) and logs an
error on rank zero. ``audit_summary`` lists every flag.

No value of a real client or example in any artifact (docs/security.md). The gradient
adversaries' pairs are gradients of one real client's examples, so the crafted pairs' norms and
cosine, the closed-form value of the pair (``epsilon0_expected``, a function of its norms) and
the test's seed (with it and the counts, the pair's geometry can be fitted) stay in
:attr:`history`, in memory only: no tag, summary field or checkpoint holds them. The audited
client, its examples and the trials are drawn from ``seed``; with ``seed=None`` (the default)
from OS entropy held in memory only, never logged or checkpointed, so no artifact tells which
client an audit used. An explicit ``seed`` is the reproducible mode: the summary marks it
(``inputs.audit_randomness``), and anyone holding the summary can tell which client each
audit used.

State: ``state_dict`` holds the history of every audit (without those fields), the warnings
given, the published norm aggregates, the count of updates seen and the audit's settings
(:data:`RESUME_SETTINGS`: ``seed``, ``adversaries``, ``alpha``, ``trials``, the randomizer's
repr). A resume that changes one of them is refused with a ``ValueError`` naming it, also when
Lightning alone would skip the state (a changed ``seed`` or ``adversaries`` changes the state
key): the audit counter would restart and spend the family-wise alpha twice. Each audit's
randomness (client, examples, the trials) is derived from ``(seed, round, adversary)``, so with
an explicit ``seed`` a run resumed from a checkpoint ends with the same numbers; with the secret
default the audits after the resume draw afresh.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from audit_callbacks import names
from audit_callbacks.attacks import (
    ADVERSARIES,
    craft_pair,
    ldp_epsilon_test,
    measurable_ceiling,
)
from audit_callbacks.auditing.output import ReportSection, result_entry, summary_document
from audit_callbacks.callbacks.summary import LightningOutput, output_summary_filename
from audit_callbacks.estimators import (
    clopper_pearson_upper,
    epsilon_from_error_rates,
)
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.federated.dp_fedavg import DPFedAvgMixin
from audit_callbacks.federated.protocol import FederatedAuditHooks, FederatedRound
from audit_callbacks.validation import (
    check_choice,
    check_count,
    check_flag,
    check_optional_count,
    check_positive,
    check_probability,
    check_seed,
)

__all__ = [
    "ADVERSARY_NAMES",
    "BrokenRandomizerWarning",
    "LDPAudit",
    "epsilon0_result",
    "exact_result",
    "familywise_alpha",
    "familywise_result",
    "flag_lower_bound",
]

_log = logging.getLogger(__name__)

FAMILY = names.FAMILY_LDP
#: Source of the per-test estimate and bounds, of the family-wise flag and of the exact audit.
SOURCE = ("Matsumoto et al. (empirical epsilon-0 test of LDP-SGD in FL), Alg. 2, eq. 3, Table 2; "
          "docs/methods/ldp.md, C1-C3")
SOURCE_FLAG = ("Kairouz, Oh & Viswanath 2015 (eps, delta) error-rate bound, Clopper-Pearson at "
               "alpha_k / 2 per rate with alpha_k = alpha / (A k (k + 1)); docs/methods/ldp.md, C2")
SOURCE_EXACT = ("the definition of epsilon-LDP: max over inputs x, x' and outputs y of "
                "log P(y|x) - log P(y|x'), by enumeration of the randomizer's output law")

#: The five adversaries of Matsumoto et al. Table 2, weakest first.
ADVERSARY_NAMES: tuple[str, ...] = ("benign", "label_flip", "gradient_flip", "collusion", "dummy")
_GRADIENT_ADVERSARIES = ("benign", "label_flip", "gradient_flip", "collusion")
_REL_TOL = 1e-9
#: The real client updates a published update-norm aggregate (its tag, the summary, the
#: checkpoint) covers at least, beyond the one published before it: a cohort of one client
#: would otherwise publish that client's norm, and two successive values their difference
#: (as the label attack's ``min_examples``).
MIN_CLIENTS_PUBLISHED = 100


class BrokenRandomizerWarning(UserWarning):
    """A lower bound on a randomizer's epsilon exceeds the epsilon it claims."""


# ------------------------------------------------------------------------------ pure numerics
def familywise_alpha(alpha: float, audit_index: int, tests_per_audit: int) -> float:
    """Significance level of each test of the ``audit_index``-th audit (1-based).

    ``alpha / (tests_per_audit * k * (k + 1))``: since ``sum_k 1/(k(k+1)) = 1``, the levels of
    all tests of all audits sum to ``alpha`` however many audits a run makes, so (union bound)
    the probability that ANY test's lower bound exceeds the true epsilon is at most ``alpha``.

    Raises:
        ValueError: alpha not in (0, 1), audit_index < 1 or tests_per_audit < 1.
    """
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    k, m = int(audit_index), int(tests_per_audit)
    if k < 1 or m < 1:
        raise ValueError(f"audit_index and tests_per_audit must be >= 1, got {k}, {m}")
    return a / (m * k * (k + 1))


def flag_lower_bound(
    tp: int, fn: int, fp: int, tn: int, alpha: float, delta: float = 0.0
) -> float:
    """One-sided (1 - alpha) lower bound on the epsilon of an (eps, delta)-DP mechanism.

    Clopper-Pearson upper bounds on FPR = FP/(FP + TN) and FNR = FN/(FN + TP) at alpha/2 each
    (union bound), then ``max(log((1 - delta - FPR_hi)/FNR_hi), log((1 - delta - FNR_hi)/FPR_hi))``
    floored at 0 (Kairouz, Oh & Viswanath 2015; docs/methods/ldp.md, C2). With ``delta = 0`` it is the lower
    bound of :func:`~audit_callbacks.attacks.ldp_epsilon_test`. 0 when a group is empty.

    Raises:
        ValueError: negative counts, alpha not in (0, 1), delta not in [0, 1).
    """
    if min(tp, fn, fp, tn) < 0:
        raise ValueError(f"counts must be >= 0, got {(tp, fn, fp, tn)}")
    n1, n2 = int(fp) + int(tn), int(fn) + int(tp)
    if n1 == 0 or n2 == 0:
        return 0.0
    fpr_hi = float(clopper_pearson_upper(int(fp), n1, alpha / 2.0))
    fnr_hi = float(clopper_pearson_upper(int(fn), n2, alpha / 2.0))
    return float(epsilon_from_error_rates(fpr_hi, fnr_hi, delta))


def _audit_ceiling(records: list[dict[str, Any]]) -> float:
    """The largest lower bound one audit's tests could show: the largest over its records of
    ``ceiling``, the zero-error eq.-3 bound at the test's realised group sizes n1 = FP + TN,
    n2 = FN + TP (:func:`~audit_callbacks.estimators.shuffle.epsilon_from_counts`). Each test's
    lower bound (and its point estimate when capped) is at most its own ``ceiling``, hence at
    most this.

    Raises:
        ValueError: ``records`` is empty.
    """
    if not records:
        raise ValueError("records: an audit with no test has no ceiling")
    return float(max(r["ceiling"] for r in records))


def _finite_or_none(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------------------ callback
class LDPAudit(FederatedAuditHooks, Callback):
    """Empirical epsilon-0 of a DP-FedAvg run's client randomizer, per adversary, during training.

    Args:
        trials: K, trials of the game per adversary and audit (Matsumoto et al.: 10 x 1000).
        alpha: the lower bounds are one-sided 1 - alpha; also the family-wise level of the flag.
        every_n_rounds: audit after every n-th round (and always at fit end).
        adversaries: names from :data:`ADVERSARY_NAMES` (default: all five).
        seed: seeds every audit (with the round and the adversary): the reproducible mode,
            marked in the summary. ``None`` (default): secret OS entropy, never logged or
            checkpointed.
        num_classes: classes for the label-flip adversary (default: the datamodule's
            ``num_classes``, else the model's output width).
        collusion_steps, collusion_lr: the server's malicious training (collusion adversary).
        path: ``"auto"`` (fast path for LDP-SGD), ``"fast"`` or ``"batched"``.
        batch_size: rows per ``randomize`` call on the batched path (default: automatic).
        exact_audit: for discrete per-coordinate mechanisms, also audit the per-coordinate
            epsilon exactly by enumeration at fit start.
        summary_filename: the JSON written at fit end in the logger's directory.

    Raises:
        ValueError: bad arguments (at construction); at a resume, a checkpoint of an
            ``LDPAudit`` with other settings (:data:`RESUME_SETTINGS`, naming the setting and
            both values).

    A module that is not a ``DPFedAvg``, or has no randomizer, is warned about once (what the
    audit needs) and the audit steps aside (``disabled_reason``); the training goes on.

    Attributes (after fit): ``history`` (one dict per adversary and audit, keyed by the names
    of :mod:`audit_callbacks.names`: ``epsilon0``, ``epsilon0_lower_bound``, and, in memory
    only, the crafted pair's ``norm_g1``...;
    :func:`epsilon0_result` makes one an :class:`AuditResult`), ``flags``, ``exact`` (the exact
    audit, keys ``epsilon_exact_per_coordinate``, ``epsilon_claimed_per_coordinate``, the
    witness and ``flagged``; or None), ``summary_path``.
    """

    def __init__(
        self,
        trials: int = 10_000,
        alpha: float = 0.05,
        every_n_rounds: int = 10,
        adversaries: Sequence[str] = ADVERSARY_NAMES,
        seed: int | None = None,
        *,
        num_classes: int | None = None,
        collusion_steps: int = 100,
        collusion_lr: float = 0.1,
        path: str = "auto",
        batch_size: int | None = None,
        exact_audit: bool = True,
        summary_filename: str = "ldp_audit_summary.json",
    ) -> None:
        trials = check_count(trials, "trials", minimum=2)
        alpha = check_probability(alpha, "alpha")
        every_n_rounds = check_count(every_n_rounds, "every_n_rounds", minimum=1)
        if isinstance(adversaries, str):
            adversaries = (adversaries,)
        advs = tuple(adversaries)
        unknown = [a for a in advs if a not in ADVERSARIES]
        if not advs or unknown or len(set(advs)) != len(advs):
            raise ValueError(
                f"adversaries must be distinct names from {ADVERSARY_NAMES}, got {advs!r}"
            )
        self.trials = trials
        self.alpha = alpha
        self.every_n_rounds = every_n_rounds
        self.adversaries = advs
        #: the audit's seed when reproducible; None: secret (``_entropy``, in memory only)
        self.seed = None if seed is None else check_seed(seed, "seed")
        self._entropy = self.seed if self.seed is not None else int(np.random.SeedSequence().entropy)
        self.num_classes = check_optional_count(num_classes, "num_classes", minimum=2)
        self.collusion_steps = check_count(collusion_steps, "collusion_steps", minimum=0)
        self.collusion_lr = check_positive(collusion_lr, "collusion_lr")
        self.path = check_choice(path, "path", ("auto", "fast", "batched"))
        self.batch_size = check_optional_count(batch_size, "batch_size", minimum=1)
        self.exact_audit = check_flag(exact_audit, "exact_audit")

        self.history: list[dict[str, Any]] = []
        self.flags: list[dict[str, Any]] = []
        self.exact: dict[str, Any] | None = None
        self.audits = 0
        self.last_audited_round = 0
        #: why the audit stepped aside in the last fit (``not_dp_fedavg``, ``no_randomizer``)
        self.disabled_reason: str | None = None
        #: aggregates over every real client update so far (no largest norm: one client's value)
        self.update_norms = {"count": 0, "at_clip": 0, "sum": 0.0}
        #: ``update_norms`` as last published: taken when it has grown by at least
        #: :data:`MIN_CLIENTS_PUBLISHED` updates; the only aggregate logged, summarised or
        #: checkpointed (a resume goes on from it)
        self.published_norms = dict(self.update_norms)
        #: the real client updates seen in the run (checkpointed: a count of the schedule, no
        #: client's value), published or not
        self.updates_seen = 0
        #: the audited randomizer (:func:`randomizer_id`), set at setup; a resume must keep it
        self.audited_randomizer: str | None = None
        self.summary_path: str | None = None
        #: the audit's output path: warnings once (the set is checkpointed), the summary, the
        #: report section, the scalars and layout
        self.output = LightningOutput("LDPAudit", summary_filename, emit=_emit,
                                  section=self._section)
        self._layout_written = False
        self._dim = 0

    summary_filename = output_summary_filename

    # ------------------------------------------------------------------ set-up
    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.seed, adversaries=self.adversaries)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.disabled_reason = None
        if not isinstance(pl_module, DPFedAvgMixin):
            return self._disable("not_dp_fedavg", (
                "LDPAudit audits the client randomizer of DP-FedAvg: fit an "
                f"audit_callbacks.federated.DPFedAvg module (got {type(pl_module).__name__})"))
        if pl_module.randomizer is None:
            return self._disable("no_randomizer", (
                "LDPAudit needs a local randomizer to audit: build DPFedAvg(..., randomizer=...) "
                "with e.g. audit_callbacks.mechanisms.LDPSGD(epsilon0, clip_norm)"))
        self._dim = int(pl_module.num_parameters)
        if self._dim < 1:
            raise ValueError("the model has no trainable parameters")
        self.audited_randomizer = randomizer_id(pl_module.randomizer)

    def _disable(self, reason: str, message: str) -> None:
        """A training this audit cannot audit: warn once and step aside for this fit (nothing
        logged, no summary: none would hold a number); training goes on."""
        self.disabled_reason = reason
        self._warn_once(reason, f"LDPAudit disabled ({reason}): {message}; training continues "
                        "without this audit", UserWarning)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer)
        if not self._layout_written:
            self.output.layout(names.chart_layout(
                [FAMILY], only=self._tags(),
                extra={names.SECTIONS[FAMILY]: {"accuracy": ["^val/accuracy$"]}}))
            self._layout_written = True
        if self.exact_audit and self.exact is None:
            self._run_exact_audit(trainer, pl_module)

    def _tags(self) -> list[str]:
        """The tags this callback logs (its adversaries'), all from :mod:`audit_callbacks.names`."""
        per_adversary = [
            names.tag(FAMILY, f"{key}_{a}") for a in self.adversaries
            for key in (names.EPSILON0_STEM, names.EPSILON0_LOWER_BOUND_STEM)
        ]
        shared = (names.EPSILON0_CLAIMED, names.EPSILON0_CEILING, names.CLIP_NORM,
                  names.CLIENT_UPDATES_AT_CLIP, names.EPSILON_EXACT_PER_COORDINATE,
                  names.EPSILON_CLAIMED_PER_COORDINATE)
        return per_adversary + [names.tag(FAMILY, n) for n in shared]

    # ------------------------------------------------------------------ protocol hooks
    def on_federated_client_updates(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        """Count the real clients' clipped update norms (raw norm >= C iff clipped to C)."""
        if self.disabled_reason is not None:
            return
        real = torch.from_numpy(fl_round.real_rows)
        if not real.numel():
            return
        updates = fl_round.updates.detach()
        norms = torch.linalg.vector_norm(updates[real.to(updates.device)].double(), dim=1).cpu().numpy()
        clip = float(pl_module.clip_norm)
        self.update_norms["count"] += int(norms.size)
        self.updates_seen += int(norms.size)
        self.update_norms["at_clip"] += int(np.count_nonzero(norms >= clip * (1 - 1e-6)))
        self.update_norms["sum"] += float(norms.sum())
        if self.update_norms["count"] - self.published_norms["count"] >= MIN_CLIENTS_PUBLISHED:
            self.published_norms = dict(self.update_norms)

    def on_federated_round_end(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        if self.disabled_reason is not None:
            return
        if fl_round.index % self.every_n_rounds == 0:
            self.audit(trainer, pl_module, fl_round.index)

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """The summary now, before Lightning's teardown can lose it (a SIGTERM after it
        restored the default handler); ``on_fit_end`` refreshes it."""
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer).end_training(lambda: self.on_fit_end(trainer, pl_module))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """SIGTERM / SIGINT: the summary of what was measured (``run_status``: ``interrupted at
        step N``), and an exit code that is not 0 (:mod:`audit_callbacks.callbacks.interrupt`)."""
        if self.disabled_reason is not None:
            return
        self.output.on_exception(trainer, exception,
                                 lambda status: self.on_fit_end(trainer, pl_module, status=status))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = "complete") -> None:
        if self.disabled_reason is not None:
            return
        self.output.bind(trainer)
        if not isinstance(pl_module, DPFedAvgMixin) or pl_module.randomizer is None:
            self.output.done(status)
            return
        current = int(pl_module.round)
        if current > 0 and current != self.last_audited_round:
            self.audit(trainer, pl_module, current)
        path = self.output.finish(self.audit_summary(pl_module, status=status), status)
        if path is not None:
            self.summary_path = path

    # ------------------------------------------------------------------ the audit
    def _clip_norm(self, pl_module: DPFedAvg) -> float:
        clip = getattr(pl_module.randomizer, "clip_norm", None)
        try:
            value = float(clip)
        except (TypeError, ValueError):
            value = math.nan
        return value if math.isfinite(value) and value > 0 else float(pl_module.clip_norm)

    def _claimed(self, pl_module: DPFedAvg) -> float:
        rnd = pl_module.randomizer
        fn = getattr(rnd, "epsilon_for_dim", None)
        return float(fn(self._dim)) if callable(fn) else float(rnd.epsilon0)

    def _num_classes(self, trainer: pl.Trainer | None, pl_module: DPFedAvg, x: torch.Tensor) -> int:
        if self.num_classes is not None:
            return int(self.num_classes)
        dm = getattr(trainer, "datamodule", None) if trainer is not None else None
        n = getattr(dm, "num_classes", None)
        if n is not None:
            return int(n)
        with torch.no_grad():
            return int(pl_module.model(x[:1]).shape[-1])

    def _craft(self, name: str, pl_module: DPFedAvg, x, y, n_classes: int, rng: np.random.Generator):
        model, loss_fn = pl_module.model, pl_module.loss_fn
        if name == "dummy":
            dtype = pl_module.flat_parameters().dtype
            return craft_pair(name, self._dim, self._clip_norm(pl_module), dtype=dtype,
                              device=pl_module.device)
        if name == "label_flip":
            return craft_pair(name, model, loss_fn, x, y, n_classes, rng=rng)
        if name == "collusion":
            counts = torch.bincount(y.cpu())
            target = int(torch.argmax(counts))  # the client's most frequent label
            return craft_pair(name, model, loss_fn, x, y, target, steps=self.collusion_steps,
                              lr=self.collusion_lr, rng=rng)
        return craft_pair(name, model, loss_fn, x, y, rng=rng)

    def audit(self, trainer: pl.Trainer | None, pl_module: DPFedAvg, round_idx: int) -> list[dict[str, Any]]:
        """Run the game for every adversary now; log, record and return the new records.

        Source: Matsumoto et al. Alg. 2 and Table 2; docs/methods/ldp.md, C2-C3.
        """
        rnd = pl_module.randomizer
        self._dim = int(pl_module.num_parameters)
        self.audits += 1
        k = self.audits
        alpha_flag = familywise_alpha(self.alpha, k, len(self.adversaries))
        delta = float(getattr(rnd, "delta", 0.0) or 0.0)
        claimed = self._claimed(pl_module)
        clip = self._clip_norm(pl_module)
        base = np.random.SeedSequence([self._entropy, int(round_idx)])
        client_ss, *adv_ss = base.spawn(1 + len(ADVERSARY_NAMES))
        cid = int(np.random.default_rng(client_ss).integers(pl_module.num_real_clients))
        x, y = pl_module.client_data(cid)  # DP-FedAvg's tensors of real client `cid`
        x, y = x.to(pl_module.device), y.to(pl_module.device)
        n_classes = self._num_classes(trainer, pl_module, x)
        records: list[dict[str, Any]] = []
        metrics: dict[str, float | None] = {
            names.tag(FAMILY, names.EPSILON0_CLAIMED): claimed,
            names.tag(FAMILY, names.CLIP_NORM): clip,
        }
        if self.published_norms["count"]:
            metrics[names.tag(FAMILY, names.CLIENT_UPDATES_AT_CLIP)] = (
                self.published_norms["at_clip"] / self.published_norms["count"]
            )
        was_training = pl_module.model.training
        for name in self.adversaries:
            ss_craft, ss_test = adv_ss[ADVERSARY_NAMES.index(name)].spawn(2)
            try:
                pair = self._craft(name, pl_module, x, y, n_classes, np.random.default_rng(ss_craft))
                test_seed = int(ss_test.generate_state(1, dtype=np.uint32)[0])
                res = ldp_epsilon_test(rnd, pair.g1, pair.g2, trials=self.trials, alpha=self.alpha,
                                       seed=test_seed, path=self.path, batch_size=self.batch_size)
            except ValueError as exc:  # e.g. a client with one label, a zero gradient
                self._warn_once(f"skip/{name}", f"LDPAudit: round {round_idx}: the {name} "
                                f"adversary was skipped: {exc}", UserWarning)
                continue
            lo_flag = flag_lower_bound(res.tp, res.fn, res.fp, res.tn, alpha_flag, delta)
            flagged = lo_flag > claimed * (1.0 + _REL_TOL)
            rec = {
                "round": int(round_idx),
                "audit": k,
                "adversary": name,
                "client": cid,
                names.EPSILON0_STEM: float(res.epsilon),
                "epsilon0_capped": bool(res.epsilon_capped),
                names.EPSILON0_LOWER_BOUND_STEM: float(res.epsilon_lower_bound),
                "epsilon0_upper_bound": _finite_or_none(res.epsilon_upper_bound),
                "epsilon0_expected": _finite_or_none(res.expected_epsilon),
                names.EPSILON0_CLAIMED: claimed,
                "ceiling": float(res.ceiling),
                "familywise_alpha": alpha_flag,
                "epsilon0_lower_bound_familywise": lo_flag,
                "delta": delta,
                "flagged": bool(flagged),
                "exceeds_claimed_per_test": bool(res.epsilon_lower_bound > claimed * (1 + _REL_TOL)),
                names.NORM_G1_STEM: float(pair.norm_g1),
                "norm_g2": float(pair.norm_g2),
                "cosine_g1_g2": _finite_or_none(pair.cosine),
                "clip_norm": clip,
                "tp": res.tp, "fn": res.fn, "fp": res.fp, "tn": res.tn,
                "trials": res.trials, "alpha": res.alpha, "method": res.method,
                "mechanism": res.mechanism, "seed": test_seed,
            }
            rec["results"] = _results(rec)  # the AuditResults of this test, made once
            records.append(rec)
            for key in (names.EPSILON0_STEM, names.EPSILON0_LOWER_BOUND_STEM):
                metrics[names.tag(FAMILY, f"{key}_{name}")] = rec[key]
            if flagged:
                self._flag(name, rec, repr(rnd))
        pl_module.model.train(was_training)
        if records:  # the ceiling of the splits that happened (none when every test was skipped)
            metrics[names.tag(FAMILY, names.EPSILON0_CEILING)] = _audit_ceiling(records)
        self.history.extend(records)
        self.last_audited_round = int(round_idx)
        if trainer is not None:
            self.output.bind(trainer)
            self.output.scalars(metrics, int(round_idx))
        return records

    def _ceiling_result(self) -> dict[str, Any]:
        """The last audit's logged ceiling (:func:`_audit_ceiling`) as a summary result, with
        the nominal split's (:func:`measurable_ceiling`) in its details."""
        nominal = measurable_ceiling(self.trials, self.alpha)
        if not self.history:
            return result_entry(None, reason="not audited")
        last = [r for r in self.history if r["audit"] == self.history[-1]["audit"]]
        return result_entry(_audit_ceiling(last), method="zero-error bound of the realised split",
                            source=SOURCE, counts={"trials": self.trials},
                            details={"nominal_split_ceiling": nominal})

    def _flag(self, name: str, rec: dict[str, Any], mechanism: str) -> None:
        self.flags.append({k: rec[k] for k in (
            "round", "adversary", names.EPSILON0_STEM, names.EPSILON0_LOWER_BOUND_STEM,
            "epsilon0_lower_bound_familywise", "familywise_alpha", names.EPSILON0_CLAIMED)})
        self._warn_once(
            f"flag/{name}",
            f"LDPAudit: BROKEN RANDOMIZER: at round {rec['round']} the {name} adversary's lower "
            f"bound {rec['epsilon0_lower_bound_familywise']:.4g} (family-wise, alpha "
            f"{rec['familywise_alpha']:.3g}) exceeds the claimed epsilon0 "
            f"{rec[names.EPSILON0_CLAIMED]:.4g} of {mechanism} (estimate {rec[names.EPSILON0_STEM]:.4g}, "
            f"{rec['trials']} trials): it does not give the privacy it states",
            BrokenRandomizerWarning,
        )

    def _warn_once(self, key: str, message: str, category: type[Warning]) -> None:
        self.output.warn(key, message, category)

    def _run_exact_audit(self, trainer: pl.Trainer, pl_module: DPFedAvg) -> None:
        rnd = pl_module.randomizer
        if not (getattr(rnd, "per_coordinate", False) and callable(getattr(rnd, "output_distribution", None))):
            return
        from audit_callbacks.mechanisms import exact_epsilon_witness

        wit = exact_epsilon_witness(rnd)
        claimed = float(rnd.epsilon_per_coordinate)
        flagged = wit.epsilon > claimed * (1.0 + _REL_TOL)
        self.exact = {
            names.EPSILON_EXACT_PER_COORDINATE: float(wit.epsilon),
            names.EPSILON_CLAIMED_PER_COORDINATE: claimed,
            "x_high": float(wit.x_high), "x_low": float(wit.x_low), "y": float(wit.y),
            "flagged": bool(flagged),
        }
        self.exact["result"] = exact_result(self.exact)  # made once, when measured
        self.output.bind(trainer)
        self.output.scalars({
            names.tag(FAMILY, names.EPSILON_EXACT_PER_COORDINATE): wit.epsilon,
            names.tag(FAMILY, names.EPSILON_CLAIMED_PER_COORDINATE): claimed,
        }, 0)
        if flagged:
            self.flags.append({"round": 0, "adversary": "exact_audit",
                               names.EPSILON_EXACT_PER_COORDINATE: float(wit.epsilon),
                               names.EPSILON_CLAIMED_PER_COORDINATE: claimed})
            self._warn_once(
                "flag/exact",
                f"LDPAudit: BROKEN RANDOMIZER: the exact audit of {rnd!r} gives a per-coordinate "
                f"epsilon of {wit.epsilon:.6g} > the claimed {claimed:.6g} (output {wit.y:g} is "
                f"e^{wit.epsilon:.4g} times likelier under input {wit.x_high:g} than under "
                f"{wit.x_low:g})",
                BrokenRandomizerWarning,
            )

    # ------------------------------------------------------------------ summary
    def randomness(self) -> str:
        """Where the audit's draws (client, examples, trials) come from, for the summary."""
        if self.seed is None:
            return SECRET_RANDOMNESS
        return (f"reproducible from seed {self.seed}: anyone holding the logs can tell which "
                "real client each audit used")

    def _section(self) -> ReportSection:
        return ReportSection(*self.report_section())

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report (written once every audit of the run
        finished): per adversary, the mean empirical epsilon0 and its largest lower bound; the
        flag."""
        out: dict[str, Any] = {"flagged": bool(self.flags)}
        for name in self.adversaries:
            recs = [r for r in self.history if r["adversary"] == name]
            if recs:
                out[f"epsilon0_mean_{name}"] = float(np.mean([r[names.EPSILON0_STEM] for r in recs]))
                out[f"epsilon0_lower_bound_max_{name}"] = float(
                    max(r[names.EPSILON0_LOWER_BOUND_STEM] for r in recs))
        if self.exact is not None:
            out[names.EPSILON_EXACT_PER_COORDINATE] = self.exact[names.EPSILON_EXACT_PER_COORDINATE]
        out["source"] = SOURCE
        return "local DP: empirical epsilon0 (Matsumoto et al.)", out

    def audit_summary(self, pl_module: DPFedAvg | None = None, *, status: str = "complete") -> dict[str, Any]:
        """The summary written at fit end (also callable any time), in the one schema
        (:mod:`audit_callbacks.auditing.output`).

        ``results``: the last audit's ``epsilon0_<adversary>`` (with its one-sided bounds) and
        ``epsilon0_lower_bound_<adversary>``, the exact audit's
        ``epsilon_exact_per_coordinate``, ``epsilon0_claimed``, ``epsilon0_ceiling`` and
        ``client_updates_at_clip``. ``history``: each audit's record with its epsilon0 test and
        family-wise bound as :class:`AuditResult` dicts (made when the test ran). It holds no
        real client's id and no value computed from one client's data (the crafted pairs'
        norms and cosine, the gradient adversaries' closed-form value and test seed): they
        stay in :attr:`history`, in memory only. ``inputs.seed`` is the audit's seed in the
        reproducible mode, None when secret; ``inputs.audit_randomness`` says which."""
        rnd = getattr(pl_module, "randomizer", None)
        by_adv: dict[str, dict[str, Any]] = {}
        results: dict[str, dict[str, Any]] = {}
        for name in self.adversaries:
            recs = [r for r in self.history if r["adversary"] == name]
            if not recs:
                for stem in (names.EPSILON0_STEM, names.EPSILON0_LOWER_BOUND_STEM):
                    results[names.qualified(stem, name)] = result_entry(None, reason="not audited")
                continue
            last = _published(recs[-1])
            by_adv[name] = {
                "audits": len(recs),
                "last": last,
                "epsilon0_mean": float(np.mean([r[names.EPSILON0_STEM] for r in recs])),
                "epsilon0_lower_bound_max": float(max(r[names.EPSILON0_LOWER_BOUND_STEM] for r in recs)),
            }
            test = last[names.EPSILON0_STEM]
            results[names.qualified(names.EPSILON0_STEM, name)] = test
            results[names.qualified(names.EPSILON0_LOWER_BOUND_STEM, name)] = result_entry(
                recs[-1][names.EPSILON0_LOWER_BOUND_STEM], alpha=test["alpha"], delta=0.0,
                method=f"{test['method']}_lower_bound", source=SOURCE, counts=test["counts"])
        published = self.published_norms
        n = published["count"]
        claimed = self._claimed(pl_module) if rnd is not None else None
        inputs = {
            "randomizer": repr(rnd),
            "dim": self._dim,
            names.EPSILON0_CLAIMED: claimed,
            "clip_norm": self._clip_norm(pl_module) if rnd is not None else None,
            "module_clip_norm": getattr(pl_module, "clip_norm", None),
            "trials": self.trials,
            "alpha": self.alpha,
            "every_n_rounds": self.every_n_rounds,
            "adversaries": list(self.adversaries),
            "seed": self.seed,
            "audit_randomness": self.randomness(),
            "rounds": int(getattr(pl_module, "round", 0) or 0),
        }
        share = (published["at_clip"] / n) if n else None
        results.update(
            epsilon0_claimed=result_entry(claimed, reason="no randomizer", method="the randomizer's claim"),
            epsilon0_ceiling=self._ceiling_result(),
            client_updates_at_clip=result_entry(share, reason=unpublished_reason(self.updates_seen),
                                                method="share of clipped client updates", counts={"n": n}),
        )
        if self.exact is not None:
            results[names.EPSILON_EXACT_PER_COORDINATE] = self.exact.get("result") or exact_result(self.exact)
            results[names.EPSILON_CLAIMED_PER_COORDINATE] = result_entry(
                self.exact[names.EPSILON_CLAIMED_PER_COORDINATE], method="the randomizer's claim")
        return summary_document(
            "LDPAudit", run_status=status, source=SOURCE,
            status="ok" if self.history else "not audited: no round was audited",
            inputs=inputs, results=results,
            tags={q.name: q.tag for q in names.family(FAMILY)},
            flag_rule="family-wise: audit k tests at alpha / (A k (k + 1)); flag when that "
                      "lower bound exceeds the claimed epsilon0 (P(any false flag) <= alpha)",
            flagged=bool(self.flags),
            flags=self.flags,
            exact_audit=None if self.exact is None else {
                names.EPSILON_EXACT_PER_COORDINATE: results[names.EPSILON_EXACT_PER_COORDINATE],
                names.EPSILON_CLAIMED_PER_COORDINATE: self.exact[names.EPSILON_CLAIMED_PER_COORDINATE],
                "flagged": self.exact["flagged"],
            },
            adversaries=by_adv,
            client_update_norms={  # aggregates of >= MIN_CLIENTS_PUBLISHED updates only
                "count": n,
                "seen": self.updates_seen,
                "status": "ok" if n else unpublished_reason(self.updates_seen),
                names.CLIENT_UPDATES_AT_CLIP: share,
                "mean": (published["sum"] / n) if n else None,
                "min_clients_published": MIN_CLIENTS_PUBLISHED,
            },
            history=[_published(r) for r in self.history],
        )

    # ------------------------------------------------------------------ state
    def settings(self) -> dict[str, Any]:
        """The settings this audit's numbers depend on (:data:`RESUME_SETTINGS`): a resume must
        keep each of them. ``randomizer`` is None before setup."""
        return {"seed": self.seed, "adversaries": list(self.adversaries), "alpha": self.alpha,
                "trials": self.trials, "randomizer": self.audited_randomizer}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another ``LDPAudit`` (as ``CanaryAudit`` does): Lightning only
        gives a callback the state saved under its own ``state_key`` (made of ``seed`` and
        ``adversaries``), so a changed one would otherwise restart the audit counter and spend
        the family-wise alpha twice, with only Lightning's generic warning. The state under this
        callback's own key is checked when it is applied (:meth:`load_state_dict`).

        Raises:
            ValueError: naming the first setting of :data:`RESUME_SETTINGS` that differs.
        """
        states = checkpoint.get("callbacks") or {}
        if self.state_key in states:
            return  # our own state is there: other LDPAudit entries are other callbacks'
        claimed = {cb.state_key for cb in trainer.callbacks}  # the states other callbacks resume
        for key, state in states.items():
            if (str(key).startswith(f"{type(self).__name__}{{") and key not in claimed
                    and isinstance(state, dict)):
                check_resume_settings(state.get("settings") or {}, self.settings())

    def state_dict(self) -> dict[str, Any]:
        """The checkpointed state. Records keep no real client's id, norms, cosine, closed-form
        value or test seed (:func:`_checkpointed`), and the secret entropy is not in it: a
        checkpoint is an output like the summary. ``settings`` (:meth:`settings`) lets a resume
        refuse a different audit."""
        return {
            "settings": self.settings(),
            "history": [_checkpointed(r) for r in self.history],
            "flags": [dict(f) for f in self.flags],
            "exact": None if self.exact is None else dict(self.exact),
            "audits": self.audits,
            "last_audited_round": self.last_audited_round,
            "update_norms": dict(self.published_norms),
            "updates_seen": self.updates_seen,
            "warned": sorted(self.output.warned),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. A checkpoint saved before its settings were kept is
        resumed unchecked.

        Raises:
            ValueError: the checkpoint's audit differs from this one in a setting of
                :data:`RESUME_SETTINGS` (naming it and both values): resuming would mix two
                audits (and, for the randomizer, keep the other one's exact audit).
        """
        if not state_dict:
            return
        check_resume_settings(state_dict.get("settings") or {}, self.settings())
        self.history = [{**r, "results": r.get("results") or _results(r)} for r in state_dict["history"]]
        self.flags = [dict(f) for f in state_dict["flags"]]
        self.exact = None if state_dict["exact"] is None else dict(state_dict["exact"])
        self.audits = int(state_dict["audits"])
        self.last_audited_round = int(state_dict["last_audited_round"])
        self.update_norms = {k: v for k, v in state_dict["update_norms"].items() if k != "max"}
        self.published_norms = dict(self.update_norms)
        self.updates_seen = int(state_dict.get("updates_seen", self.published_norms["count"]))
        self.output.warned = set(state_dict["warned"])


# ------------------------------------------------------------------------------ resume
#: The settings an audit's numbers depend on: a resume must keep each of them. ``seed`` and
#: ``adversaries`` draw the tests and size the family-wise alpha_k; ``alpha`` and ``trials`` set
#: every test; ``randomizer`` is what is audited (its exact audit runs once, at fit start).
#: ``every_n_rounds`` only sets when the audits happen, which the alpha_k allow.
RESUME_SETTINGS = ("seed", "adversaries", "alpha", "trials", "randomizer")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
#: What a resume that changed the setting would do (in the ``ValueError``).
_STATE_KEY_CHANGED = ("Lightning would skip the checkpoint's state, which it keeps under seed and "
                      "adversaries: the audit counter would restart and the family-wise alpha be "
                      "spent twice")
_MIXED = {
    "seed": _STATE_KEY_CHANGED,
    "adversaries": _STATE_KEY_CHANGED,
    "alpha": "tests at two levels reported as one run's, the family-wise alpha_k no longer "
             "summing to alpha",
    "trials": "tests of two sizes reported as one run's",
    "randomizer": "another randomizer's tests and exact audit reported as this one's",
}


def randomizer_id(randomizer: Any) -> str:
    """The randomizer as a resume compares it: its ``repr`` (the mechanisms of
    :mod:`audit_callbacks.mechanisms` print every parameter), without a default repr's memory
    address, which differs from process to process."""
    return _ADDRESS.sub("", repr(randomizer))


def check_resume_settings(theirs: dict[str, Any], mine: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first setting of :data:`RESUME_SETTINGS` in which a
    checkpoint's ``LDPAudit`` differs from this one (``seed=None``, the secret default, differs
    from any seed). A setting missing on either side (a checkpoint saved before settings were
    kept; the randomizer before setup) is not compared.

    Raises:
        ValueError: a setting differs.
    """
    for key in RESUME_SETTINGS:
        if key not in theirs or key not in mine:
            continue
        saved, given = theirs[key], mine[key]
        if key == "randomizer" and (saved is None or given is None):
            continue
        if key == "adversaries":
            saved, given = list(saved), list(given)
        if saved != given:
            fix = ("DPFedAvg(randomizer=...) as the checkpoint's" if key == "randomizer"
                   else f"{key}={saved!r}")
            raise ValueError(
                f"LDPAudit: the checkpoint's audit has {key}={saved!r}, this one {given!r}; "
                f"resuming would mix two audits ({_MIXED[key]}). Resume with {fix}, or start a "
                "new run"
            )


def unpublished_reason(seen: int) -> str:
    """Why no update-norm aggregate is published yet, having seen ``seen`` real client
    updates: none seen, or fewer than :data:`MIN_CLIENTS_PUBLISHED` (withheld, as one client's
    norm could be read from a small block)."""
    if seen <= 0:
        return "no client update seen"
    return f"fewer than {MIN_CLIENTS_PUBLISHED} client updates ({seen} seen): not published"


# ------------------------------------------------------------------------------ results
def epsilon0_result(rec: dict[str, Any]) -> AuditResult:
    """An audit record's epsilon0 test as an :class:`AuditResult` (the numbers of the record).

    ``value`` = ``epsilon0`` (eq. 3, capped at the ceiling of the group sizes when an error rate
    is 0: then ``status`` says so); ``lower`` = ``epsilon0_lower_bound``, a one-sided
    (1 - alpha) bound on the randomizer's epsilon0 at delta 0; ``upper`` =
    ``epsilon0_upper_bound``, a one-sided (1 - alpha) bound on this game's eq.-3 value (None when
    infinite). ``counts``: the game's TP, FN, FP, TN and trials.
    """
    capped = bool(rec["epsilon0_capped"])
    return AuditResult(
        value=rec[names.EPSILON0_STEM], lower=rec[names.EPSILON0_LOWER_BOUND_STEM],
        upper=rec["epsilon0_upper_bound"],
        alpha=rec["alpha"], delta=0.0, method=f"ldp_test_{rec['method']}", source=SOURCE,
        counts={k: int(rec[k]) for k in ("tp", "fn", "fp", "tn", "trials")},
        details={
            "interval": "lower and upper are each one-sided (1 - alpha) bounds",
            "ceiling": rec["ceiling"],
            "epsilon0_expected": rec["epsilon0_expected"],
            "seed": rec["seed"],
        },
        status="capped: an error rate is 0, the estimate is the ceiling of the group sizes"
        if capped else "ok",
    )


def familywise_result(rec: dict[str, Any]) -> AuditResult:
    """An audit record's family-wise lower bound (the broken-randomizer flag's) as an
    :class:`AuditResult`: ``value`` = ``epsilon0_lower_bound_familywise`` at ``alpha`` =
    ``familywise_alpha`` and the randomizer's ``delta`` (:func:`flag_lower_bound`)."""
    return AuditResult(
        value=rec["epsilon0_lower_bound_familywise"], alpha=rec["familywise_alpha"],
        delta=rec["delta"], method="clopper_pearson_familywise", source=SOURCE_FLAG,
        counts={k: int(rec[k]) for k in ("tp", "fn", "fp", "tn", "trials")},
    )


def exact_result(exact: dict[str, Any]) -> dict[str, Any]:
    """The exact audit's per-coordinate epsilon as an :class:`AuditResult` dict, its witness
    (``x_high``, ``x_low``, ``y``) in ``details``. An AuditResult is finite: when the epsilon is
    infinite (output ``y`` impossible under input ``x_low``), only ``status`` (saying so) and
    ``details``, as the canary summary does for an estimate it has not got."""
    details = {k: exact[k] for k in ("x_high", "x_low", "y")}
    eps = float(exact[names.EPSILON_EXACT_PER_COORDINATE])
    if not math.isfinite(eps):
        return {"status": f"infinite: output {exact['y']:g} has probability 0 under input "
                          f"{exact['x_low']:g} and not under {exact['x_high']:g}",
                "details": details}
    return AuditResult(value=eps, method="exact_enumeration", source=SOURCE_EXACT,
                       details=details).to_dict()


_PRIVATE_FIELDS = ("client", names.NORM_G1_STEM, "norm_g2", "cosine_g1_g2")
_PRIVATE_GRADIENT_FIELDS = ("epsilon0_expected", "seed")
#: ``inputs.audit_randomness`` of a summary whose audit drew from secret OS entropy.
SECRET_RANDOMNESS = ("secret: the audited client, examples and trials come from OS entropy, "
                     "never logged or checkpointed")
# Fields of a record that its two AuditResults carry in the summary (``trials`` stays beside).
_RESULT_FIELDS = (names.EPSILON0_STEM, "epsilon0_capped", names.EPSILON0_LOWER_BOUND_STEM,
                  "epsilon0_upper_bound", "epsilon0_expected", "ceiling", "epsilon0_lower_bound_familywise",
                  "familywise_alpha", "delta", "tp", "fn", "fp", "tn", "alpha", "seed")


def _results(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A test's two results, made when it ran (or for a record of an older checkpoint)."""
    return {names.EPSILON0_STEM: epsilon0_result(rec).to_dict(),
            "epsilon0_lower_bound_familywise": familywise_result(rec).to_dict()}


def _checkpointed(rec: dict[str, Any]) -> dict[str, Any]:
    """An audit record for the checkpoint: without the client's id and the values computed from
    its data (:func:`_private_fields`), also inside its results' ``details``."""
    private = _private_fields(rec)
    out = {k: v for k, v in rec.items() if k not in private}
    if "results" in rec:
        out["results"] = {name: _without_private_details(res, private)
                          for name, res in rec["results"].items()}
    return out


def _private_fields(rec: dict[str, Any]) -> tuple[str, ...]:
    """The fields of a record computed from a real client's data: its id and the crafted
    pair's norms and cosine; for the gradient adversaries also the pair's closed-form value
    (a function of the norms: for gradient flip below L it gives |g1|) and the test's seed
    (with it and the counts, the pair's geometry can be fitted)."""
    if rec.get("adversary") in _GRADIENT_ADVERSARIES:
        return _PRIVATE_FIELDS + _PRIVATE_GRADIENT_FIELDS
    return _PRIVATE_FIELDS


def _without_private_details(result: dict[str, Any], private: tuple[str, ...]) -> dict[str, Any]:
    details = result.get("details")
    if not isinstance(details, dict):
        return dict(result)
    return {**result, "details": {k: v for k, v in details.items() if k not in private}}


def _published(rec: dict[str, Any]) -> dict[str, Any]:
    """An audit record for the summary: its two results (made when the test ran) in place of
    their numbers, without the audited client's id or values computed from its data."""
    out = {k: rec[k] for k in ("round", "audit", "adversary")}
    kept = _checkpointed(rec)
    out.update(kept["results"])
    out.update((k, v) for k, v in kept.items()
               if k not in out and k != "results" and k not in _RESULT_FIELDS)
    return out


def _emit(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn (every rank, as before); a broken randomizer is also logged as an error on rank
    zero."""
    warnings.warn(message, category, stacklevel=4)
    if category is BrokenRandomizerWarning:
        rank_zero_only(_log.error)(message)
