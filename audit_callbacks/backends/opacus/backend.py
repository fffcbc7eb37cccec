"""Gradient canaries in Opacus DP-SGD (example-level canaries; the canary construction of Andrew
et al., ICLR 2024, Alg. 2, with a canary in the place of a training example).

Each canary is an example whose per-example gradient is ``canary_norm_multiplier *
max_grad_norm * c_j``, put among the real examples' before Opacus clips them, so that a correct
clipping makes it ``max_grad_norm * c_j`` and a clipping bug shows
(:class:`~audit_callbacks.backends.opacus.injector.GradientCanaryInjector`; after clipping, with the reason in the
summary's ``canary_insertion``, where the optimizer keeps no per-example gradients). Which
canaries join a step is drawn by the training loader's own Poisson sampler where it is Opacus'
``UniformWithReplacementSampler`` (:mod:`audit_callbacks.backends.opacus.sampling`), so a loader that
samples more often than the accountant is told shows too; else by the audit at the rate the
accountant is charged (``canary_sampling`` says why). The model moves against gradients, so
the statistics are ``cos(c_j, theta_0 - theta_t)`` and ``max_t cos(c_j, theta_{t-1} - theta_t)``.
The analytic epsilon is the run's own Opacus accountant's, with Opacus' RDP and PRV epsilons
of the same history beside it.

Each logical step is released twice to the auditor, as the mechanism releases it: the noisy
sum (with the step's rate) when Opacus has added the noise, and the model delta after the
optimizer's update. The release is described once (:meth:`OpacusBackend.release_model`: a
:class:`~audit_callbacks.canary.base.NoisySum`), and the auditor builds the steps-unknown
statistic from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from opacus.accountants import PRVAccountant

from audit_callbacks.backends.base import (
    CANARY_SHARE_WARN,
    BackendBase,
    NotAuditable,
    num_batches,
    num_examples,
)
from audit_callbacks.backends.opacus.accounting import (
    PRV_MAX_POINTS,
    prv_epsilon_status,
    run_claim,
)
from audit_callbacks.backends.opacus.buffers import FlatGather, flat_parameters
from audit_callbacks.backends.opacus.injector import GradientCanaryInjector
from audit_callbacks.backends.opacus.noise_source import NoiseSource, batch_source, noise_source
from audit_callbacks.backends.opacus.optimizer import find_accountant, find_dp_optimizer
from audit_callbacks.backends.opacus.sampling import LoaderCanarySampling, find_poisson_sampler
from audit_callbacks.canary.base import NoisySum, NoMatchedStatistic, ReleaseModel
from audit_callbacks.estimators.gaussian import gaussian_epsilon
from audit_callbacks.estimators.last_iterate import dpsgd_last_iterate_epsilon
from audit_callbacks.names import (
    EPSILON_ANALYTIC,
    EPSILON_ANALYTIC_KNOWN_BATCHES,
    EPSILON_ANALYTIC_PRV,
    EPSILON_ANALYTIC_RDP,
)

__all__ = ["DELTA_HINT", "OpacusBackend", "canary_share_warning", "dp_optimizer",
           "sampling_warning"]

#: How a DP-SGD script gives the audit its delta (Opacus' ``make_private_with_epsilon`` does not
#: keep ``target_delta``, and its accountants take delta at each ``get_epsilon(delta)`` call).
DELTA_HINT = ("the delta your script gives privacy_engine.get_epsilon(delta) (or "
              "make_private_with_epsilon's target_delta, which Opacus does not keep)")


def canary_share_warning(name: str, k: int, rate: float, real_per_step: float,
                         population: int | None = None) -> str | None:
    """The warning for ``k`` canaries joining each DP-SGD step with probability ``rate`` beside
    ``real_per_step`` expected real examples (N q), or None when they are less than
    :data:`CANARY_SHARE_WARN` of a step's examples: k q / (N q + k q), i.e. k / (N + k) at one
    rate. Each canary is an example whose clipped gradient (norm ``max_grad_norm``, a direction
    no real example has) joins the noisy sum, so many of them slow learning; the message gives
    the largest ``num_canaries`` below the share. ``population`` (N, when known) is named.
    """
    canaries = k * rate
    if k <= 0 or rate <= 0 or real_per_step <= 0:
        return None
    share = canaries / (real_per_step + canaries)
    if share < CANARY_SHARE_WARN:
        return None
    keep = max(2, math.ceil(real_per_step * CANARY_SHARE_WARN / ((1 - CANARY_SHARE_WARN) * rate)) - 1)
    if population:
        what = "outnumber the" if k > population else "join"
        among = f"{k} canaries {what} {population} training examples"
    else:
        among = f"{k} canaries join about {real_per_step:.3g} real examples a step"
    return (f"{name}: {among}, so about {share:.0%} of every step's examples are canaries "
            f"(k q = {canaries:.3g} of {real_per_step + canaries:.3g} a step); their clipped "
            "gradients join the real ones in the noisy sum, which slows learning. Pass "
            f"num_canaries={keep} or fewer to keep them under {CANARY_SHARE_WARN:.0%}")


def sampling_warning(name: str, reason: str) -> str:
    """The warning for canaries drawn by the audit instead of the training loader (``reason``:
    why), saying what follows and what fixes it for the front end ``name``: ``CanaryAudit``
    (Lightning, whose loader is ``train_dataloader``'s) or ``OpacusCanaryAudit`` (a plain loop,
    whose loader is ``make_private``'s)."""
    if "sample_rate" in reason:
        fix = f"Leave {name}'s sample_rate unset to let the loader's Poisson sampler draw them"
    elif "data-parallel" in reason:
        fix = "Data-parallel loaders draw per rank, so no fix is available there"
    elif "no training loader" in reason:
        fix = ("Give the Trainer its training loader" if name == "CanaryAudit" else
               f"Pass the training loader: {name}(..., data_loader=train_loader)")
    elif "another audit" in reason:
        fix = "Audit this loader with one canary audit"
    elif name == "CanaryAudit":  # Lightning trains on train_dataloader's loader, not make_private's
        fix = ("Return DPDataLoader.from_data_loader(loader) from the LightningModule's (or "
               "datamodule's) train_dataloader to fix it (Opacus' Poisson sampling, which its "
               "accountant assumes; make_private's poisson_sampling=True changes nothing here, "
               "as Lightning trains on train_dataloader's loader, not on the one make_private "
               "returns)")
    else:
        fix = ("Pass poisson_sampling=True to make_private and train on the loader it returns "
               "(Opacus' DPDataLoader: the sampling its accountant assumes) to fix it")
    return (f"{name}: canaries are drawn by the audit at the accountant's rate, not by the "
            f"training loader ({reason}), so the audit cannot catch a sampling bug in this "
            f"loader (one that takes examples more often than the accountant is charged). {fix}")


#: The training loader, or a function that gives the current one (Lightning builds its loader
#: after ``setup``), or None.
Loader = Any  # a loader, a function () -> loader, or None


class OpacusBackend(BackendBase):
    """Gradient canaries of an Opacus ``DPOptimizer``.

    Args:
        optimizer: the ``DPOptimizer`` (``PrivacyEngine.make_private``'s).
        loader: the training loader (its dataset's size caps the default k, its length gives
            the fallback rate, its Opacus Poisson sampler draws the canaries), a function
            returning the current one (a loader built later), or None.
        warn: ``warn(key, message)``, once per key.
        world_size: the data-parallel processes (1: one).
        sample_rate: the canaries' rate per logical step (None: the training loader's own
            Poisson sampler draws them where it is Opacus', else the rate the accountant is
            charged, else ``1 / num_batches``; given: the audit draws at this rate).
        seed: the seed of the canaries' join draws.
        module: the model (its ``delta`` attribute, if any, is the default delta).
        norm_multiplier: a canary's norm before clipping in units of ``max_grad_norm`` (None:
            the auditor's ``config.canary_norm_multiplier``).

    Raises:
        TypeError: ``optimizer`` is not an Opacus ``DPOptimizer``.
        ValueError: no rate can be found.
        RuntimeError: several processes with a non-distributed ``DPOptimizer`` on each.
    """

    training = "Opacus DP-SGD"
    sign = -1.0
    default_delta = 1e-5
    analytic_names = (EPSILON_ANALYTIC, EPSILON_ANALYTIC_RDP, EPSILON_ANALYTIC_PRV)

    def __init__(
        self, optimizer: Any, loader: Loader, warn: Callable[[str, str], None], *,
        world_size: int = 1, sample_rate: float | None = None, seed: int = 0, module: Any = None,
        norm_multiplier: float | None = None,
    ) -> None:
        opt = dp_optimizer([optimizer])
        self._optimizer, self._loader, self.world_size = opt, loader, int(world_size)
        super().__init__(int(sum(p.numel() for p in opt.params)), num_examples(self.loader()))
        self._tensors = tensor_layout(opt.params, module)
        self._module_seeds = _hparam_seeds(module)
        self.noise_source: NoiseSource | None = None
        if getattr(module, "delta", None) is not None:
            self.default_delta = float(module.delta)
        #: how to give the audit the script's delta (the auditor's default-delta warning)
        self.delta_hint = DELTA_HINT + (
            "; or give the LightningModule a delta attribute" if module is not None else "")
        self.warn = warn
        self.sample_rate = sample_rate
        self._loader_rate: float | None = None  # the accountant's rate, found at attach
        self.seed = int(seed)
        self.norm_multiplier = norm_multiplier
        #: physical batches a logical step takes where the front end knows it before the first
        #: step (Lightning's ``accumulate_grad_batches``); after a step the injector's count
        #: (Opacus' ``accumulated_iterations``) is used instead (the plan's
        #: ``audit_callbacks.auditing.plan._batches_per_step``)
        self.batches_per_step = 1
        self.injector: GradientCanaryInjector | None = None
        self.sampling: LoaderCanarySampling | None = None  # the loader's draws, where it can
        self.sampling_reason = "not attached yet"
        self._sampling_settled = False
        self._insertion_warned: str | None = None
        self.accountant: Any = None
        self._history: list[tuple[float, float, int]] = []  # carried into a new accountant
        self._sampling_state: dict[str, Any] | None = None
        # the release: theta_{t-1} and theta_t gathered into two persistent float32
        # buffers, the delta written over theta_{t-1}'s, the two swapped: two ops a step
        self._theta_prev, self._theta_next = FlatGather(torch.float32), FlatGather(torch.float32)

    @property
    def name(self) -> str:
        """The front end's name in warnings and errors (``OpacusCanaryAudit``, ``CanaryAudit``)."""
        return str(getattr(self.auditor, "name", "CanaryAudit"))

    def loader(self) -> Any:
        """The training loader now (None when there is none yet)."""
        return self._loader() if callable(self._loader) else self._loader

    def release_model(self, kind: str) -> ReleaseModel:
        """A step's release: the optimizer's noisy sum (``max_grad_norm``, ``noise_multiplier``)
        at the step's rate, of canaries of any kind; none without noise."""
        return _release_model(self._optimizer, self._tensors, self.population)

    def attach(self, auditor: Any) -> None:
        super().attach(auditor)
        self.bind(self._optimizer, self._loader, self.world_size)

    def bind(self, optimizer: Any, loader: Loader, world_size: int = 1) -> None:
        """Attach to the ``DPOptimizer``, at every fit start: the canaries, their
        participations and the step count go on. A new accountant (a new ``PrivacyEngine`` in
        ``configure_optimizers``: a repeated ``fit`` or a resumed run) receives the history
        so far, so that its epsilon, and the analytic epsilon here, cover the whole training.

        Raises:
            TypeError: no ``DPOptimizer``; ValueError: a model of another size, no rate;
            RuntimeError: several processes with a non-distributed ``DPOptimizer``.
        """
        assert self.auditor is not None
        opt = dp_optimizer([optimizer])
        self._optimizer, self._loader, self.world_size = opt, loader, int(world_size)
        dim = int(sum(p.numel() for p in opt.params))
        if dim != self.dim:
            raise ValueError(f"{self.name}: the model has {dim} parameters, the audit's canaries {self.dim}")
        accountant, rate = find_accountant(opt)
        self._loader_rate = rate  # the real examples' rate (the accountant's), for the sampler check
        if self.sample_rate is not None:
            rate = self.sample_rate
        if rate is None:
            batches = num_batches(self.loader())
            if not batches:
                raise ValueError(
                    f"{self.name}: cannot tell the DP-SGD sampling rate (no Opacus accountant hook "
                    f"and no sized train dataloader); pass {self.name}(sample_rate=...)"
                )
            rate = 1.0 / batches
            self.warn("rate", f"{self.name}: no Opacus accountant found on the optimizer's step "
                      f"hook; canaries join with rate 1/len(train_dataloader) = {rate:.4g}")
        if accountant is None:
            self.warn("acc", f"{self.name}: no Opacus accountant found on the optimizer's step hook; "
                      "the analytic epsilon is computed from the steps this audit counts")
        steps = 0
        if self.injector is not None:
            steps = self.injector.steps
            self.injector.detach()
        if self.accountant is not None and accountant is not self.accountant:
            self._history = [tuple(h) for h in self.accountant.history]
        world_size = self.world_size
        self._bind_sampling(world_size)
        multiplier = self.norm_multiplier
        if multiplier is None:
            config = getattr(self.auditor, "config", None)
            multiplier = float(getattr(config, "canary_norm_multiplier", 10.0))
        self.injector = GradientCanaryInjector(opt, self.auditor.canaries, self.auditor.num_canaries,
                                               rate, seed=self.seed, world_size=world_size,
                                               norm_multiplier=multiplier, sampling=self.sampling)
        self._warn_insertion()
        self._warn_share(opt, rate)
        # one array: the injector counts a canary's participation when the noise is added (the
        # step's release)
        self.injector.participations = self.auditor.participations
        self.injector.steps = steps
        self._check_noise_source(opt)
        if isinstance(_release_model(opt), NoisySum):  # the auditor reads the noisy sums
            self.injector.set_observer(self._release_noisy_sum)
        self.accountant = accountant
        self._carry_history()
        self._restart_deltas()
        self._steps_seen = steps

    def _release_noisy_sum(self, noisy_sum: torch.Tensor, rate: float) -> None:
        """The injector's observer: the step's noisy sum (a buffer reused by the next step:
        folded now) released to the auditor with its rate."""
        assert self.auditor is not None
        injector = self.injector
        size = injector.last_batch_size if injector is not None and self.world_size == 1 else None
        batches = injector.last_batches if injector is not None else 1
        real_rate = self._loader_rate  # the canaries' rate was given: the batches follow the loader's
        batch_rate = (min(1.0, real_rate * batches) if self.sample_rate is not None and real_rate
                      else None)
        self.auditor.release(None, noisy_sum=noisy_sum, rate=rate, batch_size=size, batches=batches,
                             batch_rate=batch_rate)

    def _check_noise_source(self, opt: Any) -> None:
        """Warn once where Opacus draws the noise from a publicly seeded generator."""
        seeds = [self.seed, *_logged_seeds(self.auditor), *self._module_seeds]
        self.noise_source = noise_source(opt, logged_seeds=seeds)
        if self.noise_source.replayable:
            self.warn("noise_source", f"{self.name}: {self.noise_source.message}")

    def _bind_sampling(self, world_size: int) -> None:
        """Let the training loader's Poisson sampler draw the canaries where it can (a sampler
        already hosting them, a repeated fit over the same loader, keeps its queue)."""
        sampler, reason = None, ""
        if self.sample_rate is not None:
            reason = f"{self.name}(sample_rate={self.sample_rate:g}) was given"
        elif world_size > 1:
            reason = "data-parallel training (the same draws on every rank)"
        else:
            current = self.sampling
            loader = self.loader()
            inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
            for candidate in (getattr(loader, "batch_sampler", None), inner):
                if current is not None and current.attached and candidate is current.sampler:
                    self.sampling_reason = ""
                    return  # the same sampler: it goes on
            sampler, reason = find_poisson_sampler(loader)
        if self.sampling is not None:
            self.sampling.detach()
            self.sampling = None
        if sampler is not None:
            assert self.auditor is not None
            self.sampling = LoaderCanarySampling(sampler, self.auditor.num_canaries, seed=self.seed)
            if self._sampling_state is not None:
                self.sampling.load_state_dict(self._sampling_state)
        self.sampling_reason = reason
        self._sampling_settled = False  # warned (or retried) at the first batch's end

    def _settle_sampling(self) -> None:
        """At the first batch's end: a loader Lightning created after ``on_fit_start`` is found
        now (the draws of its current iteration are made by the audit at its rate, the next
        iteration's by the loader); the reason of a fall-back is warned once."""
        self._sampling_settled = True
        if self.sampling is None and self.sampling_reason == "no training loader was found":
            sampler, reason = find_poisson_sampler(self.loader())
            if sampler is not None:
                assert self.auditor is not None
                self.sampling = LoaderCanarySampling(sampler, self.auditor.num_canaries, seed=self.seed)
                if self._sampling_state is not None:
                    self.sampling.load_state_dict(self._sampling_state)
                self.injector.sampling = self.sampling
            self.sampling_reason = reason
        if self.sampling is None:
            self.warn("sampling", sampling_warning(self.name, self.sampling_reason))

    def _warn_share(self, opt: Any, rate: float) -> None:
        """Warn once when the canaries are :data:`CANARY_SHARE_WARN` or more of a step's
        examples (:func:`canary_share_warning`)."""
        assert self.auditor is not None
        expected = getattr(opt, "expected_batch_size", None)
        # the real examples a step sees: Opacus' expected batch (per process), else N q
        real = float(expected) * self.world_size if expected else float(self.population or 0) * rate
        message = canary_share_warning(self.name, self.auditor.num_canaries, float(rate), real,
                                       self.population)
        if message:
            self.warn("share", message)

    def _warn_insertion(self) -> None:
        """Warn once when the canaries enter after clipping (the reason, in the summary too)."""
        insertion = self.injector.insertion
        if insertion != "before clipping" and insertion != self._insertion_warned:
            self._insertion_warned = insertion
            self.warn("insertion", f"{self.name}: canaries enter the DP-SGD sum {insertion}, so a "
                      "clipping bug does not show in the estimates")

    def _carry_history(self) -> None:
        """Put the history so far in front of the accountant's own, once."""
        acc, old = self.accountant, self._history
        if acc is None or not old:
            return
        current = [tuple(h) for h in acc.history]
        if current[: len(old)] == old:
            return  # the same accountant, or one that holds the history already
        acc.history = [*old, *current]
        self.warn("history", f"{self.name}: a new Opacus accountant (resumed or repeated fit): "
                  f"{sum(h[2] for h in old)} earlier steps were put back into its history, so "
                  "its epsilon covers the whole training")

    def flat_parameters(self) -> torch.Tensor:
        """The model now, ``[d]`` float32 on the model's device (a new tensor)."""
        return flat_parameters(self.injector.optimizer.params)

    def _restart_deltas(self) -> None:
        """The next release's delta is taken against the parameters as they are now."""
        self._theta_prev.gather(self.injector.optimizer.params)

    def _step_delta(self) -> torch.Tensor:
        """``theta_t - theta_{t-1}`` ``[d]`` float32 (the bits of ``flat_parameters() - previous``)
        written over theta_{t-1}'s buffer, which the next step gathers its parameters into (two
        buffers in all); theta_t becomes the next step's previous."""
        theta = self._theta_next.gather(self.injector.optimizer.params)
        prev = self._theta_prev.flat
        assert prev is not None
        delta = torch.sub(theta, prev, out=prev)  # theta_{t-1} is not needed again
        self._theta_prev, self._theta_next = self._theta_next, self._theta_prev
        return delta

    def progress(self) -> int:
        return int(self.injector.steps)

    def on_train_batch_end(self) -> None:
        """After an optimizer call: release the parameter delta if a logical step was taken
        (gradient accumulation and ``BatchMemoryManager`` take none on most batches)."""
        assert self.auditor is not None
        if not self._sampling_settled:
            self._settle_sampling()
        steps = self.injector.steps
        if steps == self._steps_seen:
            return
        self._warn_insertion()
        # a buffer overwritten at the next step: the auditor folds it now (the all-iterates
        # statistic keeps no reference it would read later)
        self.auditor.release(self._step_delta(), what=f"step {steps}")
        self._steps_seen = steps

    def analytic(self, delta: float) -> dict[str, float | None]:
        """The run's accountant's epsilon and Opacus' RDP and PRV epsilons of its history
        (``epsilon_analytic``, ``epsilon_analytic_rdp``, ``epsilon_analytic_prv``; ``inf``
        without noise)."""
        if float(self.injector.optimizer.noise_multiplier) == 0:
            return dict.fromkeys((EPSILON_ANALYTIC, EPSILON_ANALYTIC_RDP, EPSILON_ANALYTIC_PRV), math.inf)
        acc = self.accountant
        history = list(getattr(acc, "history", None) or [])
        if not history and self.injector.steps:
            opt = self.injector.optimizer
            history = [(float(opt.noise_multiplier), self.injector.sample_rate, self.injector.steps)]
        # the run's own accountant's epsilon is computed whatever its cost (it is the claim);
        # a PRV epsilon beside an RDP run only up to its bound (a status says when skipped)
        bound = None if isinstance(acc, PRVAccountant) else PRV_MAX_POINTS
        # the claim and the audit plan's come from one function (run_claim)
        out, claim = run_claim(acc, history, delta)
        self._prv_status = prv_epsilon_status(history, delta, bound) if out["prv"] is None else "ok"
        return {EPSILON_ANALYTIC: claim,
                EPSILON_ANALYTIC_RDP: out["rdp"], EPSILON_ANALYTIC_PRV: out["prv"]}

    def summary_status(self) -> dict[str, str]:
        """``epsilon_analytic_prv_status`` where the PRV epsilon was skipped (its cost bound)."""
        status = getattr(self, "_prv_status", "ok")
        return {} if status == "ok" else {"epsilon_analytic_prv_status": status}

    def last_iterate(self, delta: float) -> float | None:
        """The last-iterate heuristic of DP-SGD (Steinke et al., ICLR 2025): Bin(T, q) +
        N(0, sigma^2 T) against N(0, sigma^2 T) at the run's steps, rate and noise, where the
        steps-unknown statistic has no history of the rates the steps were taken at."""
        opt = self.injector.optimizer
        steps, sigma = int(self.injector.steps), float(opt.noise_multiplier)
        if steps < 1 or sigma <= 0:
            return None
        return dpsgd_last_iterate_epsilon(steps, self.injector.sample_rate, sigma, delta)

    def batches(self) -> Any:
        """What the training loader's batches are: secret, known (replayable from a public or
        logged seed) or not checked (:func:`~audit_callbacks.backends.opacus.noise_source.batch_source`)."""
        # the audit's own seed is public but not the training's: never named in the text
        return batch_source(self.loader(), logged_seeds=self._module_seeds,
                            public_seeds=[self.seed, *_logged_seeds(self.auditor)])

    def claim(self, delta: float) -> dict[str, Any]:
        """Which sampling the claim assumes and, where the batches are known, the unamplified
        claim beside it: the most-sampled canary took part in r steps, each a Gaussian
        mechanism of noise multiplier z once the batches are known, so its epsilon is the
        r-fold composition (:func:`~audit_callbacks.estimators.gaussian.gaussian_epsilon`), not
        the accountant's amplified one."""
        source = self.batches()
        out: dict[str, Any] = {"claim_sampling": source.sampling}
        if not source.known or self.auditor is None:
            return out
        r = int(self.auditor.participations.max(initial=0))
        sigma = float(self.injector.optimizer.noise_multiplier)
        if sigma <= 0:
            value: float | None = math.inf
        else:
            value = gaussian_epsilon(sigma, delta, compositions=r) if r else None
        out[EPSILON_ANALYTIC_KNOWN_BATCHES] = value
        out[f"{EPSILON_ANALYTIC_KNOWN_BATCHES}_status"] = (
            f"the batches are known: the most-sampled canary took part in {r} steps, a {r}-fold "
            f"Gaussian mechanism of noise multiplier {sigma:g} without amplification by sampling; "
            f"the claim at delta = {delta:g} for anyone holding the seed" if r else "no canary took part yet")
        return out

    def summary_inputs(self) -> dict[str, Any]:
        opt = self.injector.optimizer
        if self.sampling is not None:
            sampling: dict[str, Any] = {
                "canary_sampling": "training loader (Opacus UniformWithReplacementSampler)",
                "loader_sample_rate": self.sampling.sample_rate,
                "loader_batches_drawn": self.sampling.batches,
                "canary_draws_by_audit": self.sampling.draws_by_audit}
        else:
            sampling = {"canary_sampling": f"drawn by the audit at the accountant's rate: {self.sampling_reason}"}
        return {
            "canary_insertion": self.injector.insertion,
            "canary_norm_multiplier": self.injector.norm_multiplier,
            **sampling,
            "steps": self.injector.steps,
            "noise_multiplier": float(opt.noise_multiplier),
            "max_grad_norm": float(opt.max_grad_norm),
            "expected_batch_size": opt.expected_batch_size,
            "sample_rate": self.injector.sample_rate,
            "accountant": None if self.accountant is None else type(self.accountant).__name__,
            "noise_source": None if self.noise_source is None else self.noise_source.as_dict(),
        }

    def detach(self) -> None:
        self.injector.detach()
        if self.sampling is not None:
            self.sampling.detach()
            self.sampling = None

    def state_dict(self) -> dict[str, Any]:
        history = [] if self.accountant is None else [list(h) for h in self.accountant.history]
        sampling = None if self.sampling is None else self.sampling.state_dict()
        return {"steps": int(self.injector.steps), "batches": int(self.injector.batches_total),
                "accountant_history": history, "sampling": sampling}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, the accountant's history included (Opacus'
        ``PrivacyEngine`` is not in Lightning's checkpoint: without this a resumed run's
        accountant would count only the steps after the resume)."""
        self.injector.steps = self._steps_seen = int(state.get("steps", 0))
        self.injector.batches_total = int(state.get("batches", self.injector.steps))  # older: 1 a step
        self._history = [tuple(h) for h in state.get("accountant_history", [])]
        self._sampling_state = state.get("sampling")
        if self.sampling is not None and self._sampling_state is not None:
            self.sampling.load_state_dict(self._sampling_state)
        self._carry_history()
        self._restart_deltas()


def _release_model(opt: Any, tensors: tuple[tuple[str, int], ...] = (),
                   population: int | None = None) -> ReleaseModel:
    sigma = float(opt.noise_multiplier)
    if sigma <= 0:
        return NoMatchedStatistic("no DP noise (noise_multiplier = 0): the steps-unknown statistic is undefined")
    return NoisySum(max_grad_norm=float(opt.max_grad_norm), noise_multiplier=sigma,
                    tensors=tensors, population=population)


def tensor_layout(params: Any, module: Any = None) -> tuple[tuple[str, int], ...]:
    """``((name, numel), ...)`` of ``params`` in order: the module's parameter names where it
    has them (Opacus' ``_module.`` prefix dropped), else ``params[i] (shape)``."""
    names: dict[int, str] = {}
    if module is not None and callable(getattr(module, "named_parameters", None)):
        for name, p in module.named_parameters():
            names.setdefault(id(p), name.replace("_module.", ""))
    return tuple((names.get(id(p), f"params[{i}] {tuple(p.shape)}"), int(p.numel()))
                 for i, p in enumerate(params))


def _hparam_seeds(module: Any) -> list[int]:
    """The integers a LightningModule's logged hyperparameters hold under a name with "seed"."""
    hparams = getattr(module, "hparams", None)
    if not hasattr(hparams, "items"):
        return []
    return [int(v) for k, v in hparams.items()
            if "seed" in str(k).lower() and isinstance(v, int) and not isinstance(v, bool)]


def _logged_seeds(auditor: Any) -> list[int]:
    """Integer seeds the run's logged hyperparameters hold (public by being logged)."""
    out = []
    config = getattr(auditor, "config", None)
    if config is not None and isinstance(getattr(config, "seed", None), int):
        out.append(int(config.seed))
    return out


def dp_optimizer(optimizers: Any) -> Any:
    """The Opacus ``DPOptimizer`` among ``optimizers``; :class:`~audit_callbacks.backends.base.
    NotAuditable` (a ``TypeError``) when there is none."""
    opt = find_dp_optimizer(optimizers)
    if opt is None:
        raise NotAuditable(
            "CanaryAudit audits DP-FedAvg (audit_callbacks.federated.DPFedAvg) or Opacus "
            "DP-SGD, but the trainer has no Opacus DPOptimizer: return the optimizer of "
            "PrivacyEngine().make_private(...) from configure_optimizers"
        )
    return opt
