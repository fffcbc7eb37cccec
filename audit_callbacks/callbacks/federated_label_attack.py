"""Label reconstruction from each client's update in DP-FedAvg with one local step (FedSGD).

Threat model: the server of :class:`~audit_callbacks.federated.DPFedAvg` without secure
aggregation sees every sampled client's clipped update before the central noise is added
(``on_federated_client_updates``), knows the global model and, here, the client's features
(white box, known features: the setting of Yuan, Xue, Wang & Shen 2022, "Deep Gradient Attacks
with Strong DP-SGD Lower Bounds for Label Privacy", §3 eq. (1), Alg. 1 and 3). With one local SGD
step on the whole client data set (``local_epochs=1``, ``local_batch_size`` >= the client's
size), the update is Delta = -lr c mean_r grad L_r with one clip factor c > 0 for the whole
update, so the last layer's part of -Delta is a positive multiple of the aggregated gradient of
eq. (1): the attack recovers every label exactly without noise (argmin of the solved statistic
for a softmax layer, sign for a sigmoid logit).

Logged per round (``fl_label_attack/``): ``accuracy`` (the server's view, clipped rows),
``accuracy_noised`` (the same attack on the row plus the central noise N(0, (z C)^2 I) of the
release, i.e. what an observer of the noisy aggregate learns about a client when the others'
updates are known), ``expected_accuracy_noised`` (the mean over the client's examples of
P(argmin = y_r), docs/methods/label_dp_multiclass.md eq. (3)), ``attacked_clients``, and the
label-DP lower bound of the release for one label of one client
(:func:`~audit_callbacks.estimators.label_dp.client_update_label_dp_lower_bound`, with
the replaced label's clip factor computed exactly from the whole update, docs/methods/
label_dp_multiclass.md eq. (7)):
``epsilon_lower_bound`` (max over the round's attacked clients), ``epsilon_lower_bound_max``
(running maximum) beside ``epsilon_single_round``, the upper bound of one round for one label (the
Gaussian mechanism with sensitivity 2C, no amplification). The bound assumes the release is the
cohort sum plus N(0, (z C)^2 I) only: with a local randomizer the noised metrics and the bound
are skipped with a reason. Clients with more examples than the last layer has coefficients
(N > p + 1) or more than one local step are skipped with a reason (counted in the summary).

The accuracies are published over blocks of ``min_examples`` attacked examples, and a
checkpoint keeps only the published sums, so a resumed fit drops the examples attacked after
the checkpoint's last block. The summary's ``attacked_clients`` counts every client attacked
(those included); the accuracy's ``counts`` say which of them it covers: ``n`` the clients whose
examples the published accuracies cover, ``attacked_clients`` all, ``clients_dropped_at_resume``
those whose examples a resume dropped; where a resume dropped any, the accuracy's status says
so in words. Client counts only: how many examples were dropped is not kept (with one client a
round it would be that client's dataset size).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from audit_callbacks import names
from audit_callbacks.attacks.label_gradients import (
    gradient_scale,
    label_change_gradients,
    mean_loss_gradient,
)
from audit_callbacks.attacks.label_reconstruction import factorize_layer, reconstruct_labels
from audit_callbacks.auditing.output import ReportSection, result_entry, summary_document
from audit_callbacks.callbacks.summary import LightningOutput, output_summary_filename
from audit_callbacks.estimators.label_dp import client_update_label_dp_lower_bound
from audit_callbacks.federated.protocol import FederatedAuditHooks, FederatedRound
from audit_callbacks.validation import check_count, check_delta, check_real, check_seed

SOURCE = ("Yuan, Xue, Wang & Shen (2022), Deep Gradient Attacks with Strong DP-SGD Lower Bounds for "
          "Label Privacy, §3 eq. (1), Alg. 1 and 3; softmax: docs/methods/label_dp_multiclass.md")


def _emit(message: str) -> None:
    rank_zero_warn(f"FederatedLabelAttack: {message}", category=UserWarning)


__all__ = ["FederatedLabelAttack"]

FAMILY = names.FAMILY_FL_LABEL_ATTACK  # its quantities in audit_callbacks.names
#: the sums over attacked examples behind the published accuracies, and the count of the
#: clients those examples are from
_TOTALS = ("attacked_examples", "correct", "noised_examples", "correct_noised", "expected_examples", "expected",
           names.ATTACKED_CLIENTS)

_CHUNK_ENTRIES = 8_000_000  # float64 entries of per-pair gradients held at once (64 MB)


@contextmanager
def _side_effect_free(model: nn.Module) -> Iterator[None]:
    """Run the attack's forwards of the global model without changing training: its buffers
    (BatchNorm running statistics) and the global RNG state (dropout) are restored."""
    saved = {k: b.detach().clone() for k, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            with torch.no_grad():
                for k, b in model.named_buffers():
                    b.copy_(saved[k])


class FederatedLabelAttack(FederatedAuditHooks, Callback):
    """Attack each sampled real client's last-layer update in FedSGD (see the module docstring).

    Args:
        noise_multiplier: z of the central noise for ``accuracy_noised`` and the bound (default:
            the module's ``noise_multiplier``); 0 disables the noised attack and the bound. Another
            value than the module's describes a hypothetical release (the summary's
            ``noise_multiplier_is_the_release`` is then false).
        delta: delta of the bounds (default: the module's ``delta`` or 1e-5).
        seed: seeds the simulated noise of ``accuracy_noised`` (an attack's draw, not the
            release's noise).
        summary_filename: JSON at fit end in the logger's directory (None: none).
        min_examples: attacked examples per published block of the accuracies (default 100,
            >= 1): ``accuracy``, ``accuracy_noised`` and ``expected_accuracy_noised`` are
            running means over the attacked examples, logged, summarized and checkpointed only
            when another ``min_examples`` examples were attacked since the last time (with one
            client a round, a round's value would be that client's; two successive values'
            difference covers at least a block), as ``LabelReconstructionAttack``.

    Raises:
        ValueError: naming the argument: ``noise_multiplier`` neither None nor a finite real
            >= 0, ``delta`` neither None nor in (0, 1), ``seed`` not an integer >= 0,
            ``min_examples`` not an integer >= 1, ``summary_filename`` outside the run folder.

    Never aborts the fit: on a module that is not ``DPFedAvg``-like, a model without an
    ``nn.Linear`` layer or more than one local step it warns once, logs why and does nothing.
    """

    def __init__(self, *, noise_multiplier: float | None = None, delta: float | None = None, seed: int = 0,
                 summary_filename: str | None = "federated_label_attack_summary.json",
                 min_examples: int = 100) -> None:
        self.noise_multiplier = (None if noise_multiplier is None
                                 else check_real(noise_multiplier, "noise_multiplier", low=0.0))
        self.delta = None if delta is None else check_delta(delta)
        self.seed = check_seed(seed)
        self.min_examples = check_count(min_examples, "min_examples", minimum=1)
        self.running_max = 0.0
        self.flipped_clip: str | None = None
        # one row per attacked client, in memory only (a real client's id, dataset size and
        # noise-free attack accuracy): never summarized or checkpointed
        self.history: list[dict[str, float]] = []
        self.attacked_clients = 0  # a count over every attacked client (summary, checkpoint)
        #: sums over the attacked examples (in memory), and as last published: a block of
        #: min_examples more examples (the only sums logged, summarized or checkpointed)
        self.totals = dict.fromkeys(_TOTALS, 0.0)
        self.published = dict(self.totals)
        self.num_classes: int | None = None  # the last layer's outputs, once a client was read
        self.rounds: list[dict[str, float]] = []
        self.skips: Counter[str] = Counter()
        self.summary_path: str | None = None
        #: the audit's output path: warnings once (also as TensorBoard text), the summary, the
        #: report section, the scalars
        self.output = LightningOutput("FederatedLabelAttack", summary_filename, emit=_emit,
                                  section=self._section,
                                  text_tag=names.tag(FAMILY, names.WARNINGS))
        self._gen = torch.Generator().manual_seed(self.seed)

    summary_filename = output_summary_filename

    def _warn_once(self, trainer: pl.Trainer, key: str, message: str) -> None:
        self.skips[key] += 1
        self.output.warn(key, message)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.output.bind(trainer)
        self.output.layout(names.chart_layout([FAMILY]))

    @staticmethod
    def _head(module: Any, x: torch.Tensor) -> nn.Linear | str:
        """The model's logit layer: the last ``nn.Linear`` called in a forward pass of ``x``
        whose output is the model's output (of a tuple its first element, of a mapping its
        ``"logits"``), else the last one whose output has its rows and size (an element-wise
        function after the head keeps them). Not the last one registered: a head declared
        first, or a weight-tied ``nn.Linear`` declared after it, would make that a hidden
        layer. The reason (text) where no ``nn.Linear`` output is the model's output."""
        model = getattr(module, "model", module)
        calls: list[tuple[nn.Linear, Any]] = []
        handles = [m.register_forward_hook(lambda m, a, o: calls.append((m, o)))
                   for m in model.modules() if isinstance(m, nn.Linear)]
        try:
            with torch.no_grad(), _side_effect_free(model):
                out = model(x.to(module.device))
        finally:
            for h in handles:
                h.remove()
        if isinstance(out, Mapping):
            out = out.get("logits", next(iter(out.values()), None))
        elif isinstance(out, (tuple, list)) and out:
            out = out[0]
        if not calls or not isinstance(out, torch.Tensor) or out.ndim < 1:
            return "no nn.Linear layer's output is the model's output"
        for layer, o in reversed(calls):
            if o is out:
                return layer
        for layer, o in reversed(calls):
            if isinstance(o, torch.Tensor) and o.ndim >= 1 and o.shape[0] == out.shape[0] and o.numel() == out.numel():
                return layer
        return (f"no nn.Linear layer's output is the model's output (of shape {tuple(out.shape)}; the nn.Linear "
                f"layers called have {sorted({int(m.out_features) for m, _ in calls})} outputs)")

    @staticmethod
    def _last_layer(module: Any, last: nn.Linear) -> tuple[nn.Linear, int, int | None] | None:
        """``last`` (the model's logit layer) and the offsets of its weight and bias in the flat
        vector of trainable parameters."""
        offsets: dict[int, int] = {}
        offset = 0
        for p in module.trainable_parameters():
            offsets[id(p)] = offset
            offset += p.numel()
        if id(last.weight) not in offsets or (last.bias is not None and id(last.bias) not in offsets):
            return None
        return last, offsets[id(last.weight)], (offsets[id(last.bias)] if last.bias is not None else None)

    def on_federated_client_updates(self, trainer: pl.Trainer, pl_module: Any, fl_round: FederatedRound) -> None:
        found = None
        if hasattr(pl_module, "trainable_parameters") and hasattr(pl_module, "client_data"):
            real = fl_round.real_rows
            if not real.size:
                return  # only canaries this round: no labels to recover
            head = self._head(pl_module, pl_module.client_data(int(fl_round.row_ids[real][0]))[0])
            if isinstance(head, str):
                self._warn_once(trainer, "unsupported_model", f"needs a model whose logits are an nn.Linear "
                                f"layer's output: {head}; nothing attacked")
                return
            found = self._last_layer(pl_module, head)
        if found is None:
            self._warn_once(trainer, "unsupported_model", "needs DPFedAvg over a model with a trainable nn.Linear "
                            "last layer; nothing attacked")
            return
        layer, w_off, b_off = found
        z = float(pl_module.noise_multiplier if self.noise_multiplier is None else self.noise_multiplier)
        if z > 0 and getattr(pl_module, "randomizer", None) is not None:
            self._warn_once(trainer, "local_randomizer", "the clients randomize their updates locally; the noised "
                            "attack and the bound model the central noise only, so they are skipped")
            z = 0.0
        c_norm = float(pl_module.clip_norm)
        own = getattr(pl_module, "delta", None)
        delta = self.delta if self.delta is not None else (float(own) if own else 1e-5)
        accs, noised, expected, bounds = [], [], [], []
        single_round = None
        updates = fl_round.updates
        real = fl_round.real_rows  # virtual clients (canaries) carry no labels to recover
        for row, cid in zip(real.tolist(), fl_round.row_ids[real].tolist(), strict=True):
            x_all, y_all = pl_module.client_data(cid)
            n = int(x_all.shape[0])
            if int(pl_module.local_epochs) != 1 or int(pl_module.local_batch_size) < n:
                self._warn_once(trainer, "not_fedsgd", "the attack needs one local step on the whole client data "
                                "(local_epochs=1, local_batch_size >= client size); client skipped")
                continue
            feats, logits = self._forward(pl_module, layer, x_all)
            k = layer.out_features
            self.num_classes = max(2, int(k))  # the report's chance level, 1 / classes
            p = layer.in_features
            if n > p + (b_off is not None):
                self._warn_once(trainer, "batch_wider_than_layer", f"a client with {n} examples is larger than the "
                                f"last layer's {p} inputs allow; client skipped")
                continue
            upd = updates[row].detach().to("cpu", torch.float64)
            w = -upd[w_off:w_off + k * p].reshape(k, p)  # -Delta = lr c G: a positive multiple
            b = -upd[b_off:b_off + k] if b_off is not None else None
            try:
                f = factorize_layer(feats, bias=b is not None)
                pred = reconstruct_labels(feats, w, b, factorization=f)
            except ValueError as err:
                self._warn_once(trainer, "rank_deficient", f"client skipped: {err}")
                continue
            y = y_all.reshape(-1).to(torch.int64)
            accs.append(float((pred == y).double().mean()))
            self.totals["attacked_examples"] += n
            self.totals["correct"] += float((pred == y).double().sum())
            self.totals[names.ATTACKED_CLIENTS] += 1
            row_out = {"round": float(fl_round.index), "client": float(cid),
                       names.ACCURACY: accs[-1], "examples": float(n)}
            if z > 0:
                noise = torch.randn(upd.shape[0], generator=self._gen, dtype=torch.float64) * (z * c_norm)
                wn = w - noise[w_off:w_off + k * p].reshape(k, p)
                bn = b - noise[b_off:b_off + k] if b is not None else None
                pred_n = reconstruct_labels(feats, wn, bn, factorization=f)
                noised.append(float((pred_n == y).double().mean()))
                self.totals["noised_examples"] += n
                self.totals["correct_noised"] += float((pred_n == y).double().sum())
                row_out[names.ACCURACY_NOISED] = noised[-1]
                res = self._bound(trainer, pl_module, f, w, b, logits, y, z, c_norm, delta, x_all, updates[row])
                if res is not None:
                    expected.append(res.expected_attack_accuracy.value)
                    self.totals["expected_examples"] += n
                    self.totals["expected"] += n * float(expected[-1])
                    bounds.append(res.epsilon_lower_bound.value)
                    single_round = res.epsilon_single_round.value
                    row_out[names.EXPECTED_ACCURACY_NOISED] = expected[-1]
                    row_out[names.EPSILON_LOWER_BOUND] = bounds[-1]
            self.history.append(row_out)
            self.attacked_clients += 1
        if not accs:
            return
        metrics: dict[str, float] = {names.ATTACKED_CLIENTS: len(accs)}  # names of FAMILY
        if self.totals["attacked_examples"] - self.published["attacked_examples"] >= self.min_examples:
            self.published = dict(self.totals)  # a full block: the running means move on
            metrics.update({k: v for k, v in self._means().items() if v is not None})
        if bounds:
            self.running_max = max(self.running_max, max(bounds))
            metrics[names.EPSILON_LOWER_BOUND] = float(max(bounds))
            metrics[names.EPSILON_LOWER_BOUND_MAX] = self.running_max
            metrics[names.EPSILON_SINGLE_ROUND] = float(single_round)
        self.rounds.append({"round": float(fl_round.index), "noise_multiplier": z, **metrics})
        self.output.scalars({names.tag(FAMILY, k): v for k, v in metrics.items()}, int(trainer.global_step))

    def _bound(self, trainer: pl.Trainer, pl_module: Any, f: Any, w: torch.Tensor, b: torch.Tensor | None,
               logits: torch.Tensor, y: torch.Tensor, z: float, c_norm: float, delta: float, x: torch.Tensor,
               update: torch.Tensor) -> Any:
        """The client's label-DP bound, or None (warned) when its update is not lr c mean of
        log-loss / cross-entropy gradients."""
        n = int(y.shape[0])
        rhs = torch.cat([w, b.reshape(-1, 1)], dim=1) if b is not None else w
        means = n * f.solve(rhs.T)  # noise-free statistic lr c (p_r - e_{y_r}), [N, K]
        if logits.shape[1] == 1:
            probs = torch.sigmoid(logits[:, 0]).clamp(1e-12, 1 - 1e-12).numpy()
            err = probs - y.numpy()
        else:
            probs = torch.softmax(logits, dim=1).numpy()
            err = probs - np.eye(probs.shape[1])[y.numpy()]
        scale = gradient_scale(err, means)
        lr = float(pl_module.local_lr)
        if scale is None or scale > lr * (1 + 1e-3):
            self._warn_once(trainer, "unsupported_loss", "the client's last-layer update is not -lr c times the mean "
                            "log-loss / cross-entropy gradient (c <= 1); no bound for this client")
            return None
        flip = self._flipped_clip(trainer, pl_module, x, y, update, min(1.0, scale / lr), lr, c_norm)
        try:
            with _side_effect_free(pl_module.model):
                return client_update_label_dp_lower_bound(
                    probs, y.numpy(), f.gram_inv_diag, update_scale=min(scale, lr), local_lr=lr, noise_multiplier=z,
                    clip_norm=c_norm, delta=delta, flipped_clip_factors=flip)
        except (RuntimeError, ValueError) as err:
            self._warn_once(trainer, "bound_failed", f"no bound for this client: {err}")
            return None

    def _flipped_clip(self, trainer: pl.Trainer, pl_module: Any, x: torch.Tensor, y: torch.Tensor,
                      update: torch.Tensor, c: float, lr: float, c_norm: float) -> Any:
        """``(rows, labels) -> c'``: the clip factor min(1, C / ||Delta_raw - (lr / n) D||) of the
        client's update had example r carried label y' (D = grad (L_r(y') - L_r(y_r)),
        :func:`label_change_gradients`), after checking that Delta_raw = Delta / c is -lr times the
        gradient of the mean loss at the global model; None (conservative bound) when it is not."""
        model, n = pl_module.model, int(y.shape[0])
        dev = next(model.parameters()).device
        x, y = x.to(dev), y.to(dev)
        raw = update.to(dev, torch.float64) / c
        coupled = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        ok = False
        if not coupled:  # each example's gradient is evaluated alone below
            try:
                with _side_effect_free(model):
                    g = mean_loss_gradient(model, x, y)
                ok = bool(torch.linalg.vector_norm(raw + lr * g) <= 1e-3 * torch.linalg.vector_norm(raw))
            except (RuntimeError, ValueError):
                ok = False
        if not ok:
            self.flipped_clip = "unknown: P1 maximised over the clip factor (conservative, at most log K)"
            why = ("the model has BatchNorm layers (examples are coupled)" if coupled else
                   "the client's update is not one SGD step on the mean cross-entropy / log-loss")
            self._warn_once(trainer, "flipped_clip", f"{why}, so the replaced label's clip factor is unknown: the "
                            "bound uses the conservative form (at most log K)")
            return None
        self.flipped_clip = "exact (the whole update's norm with the label replaced, torch.func)"

        chunk = max(1, _CHUNK_ENTRIES // raw.numel())  # rows of [P, d] float64 gradients held at once

        def fn(rows: np.ndarray, labels: np.ndarray) -> np.ndarray:
            r = torch.as_tensor(rows, device=dev)
            lab = torch.as_tensor(labels, device=dev)
            norms = []
            for i in range(0, r.shape[0], chunk):
                d = label_change_gradients(model, x[r[i:i + chunk]], y[r[i:i + chunk]], lab[i:i + chunk])
                norms.append(torch.linalg.vector_norm(raw[None, :] - (lr / n) * d, dim=1))
            return torch.clamp(c_norm / torch.cat(norms), max=1.0).cpu().numpy()

        return fn

    @staticmethod
    def _forward(pl_module: Any, layer: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's inputs [N, p] and outputs [N, K] (float64) under the current global model."""
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        handle = layer.register_forward_hook(lambda m, a, o: seen.append((a[0].detach(), o.detach())))
        try:
            with torch.no_grad(), _side_effect_free(pl_module.model):
                pl_module.model(x.to(pl_module.device))
        finally:
            handle.remove()
        inputs, outputs = seen[-1]
        return (inputs.reshape(x.shape[0], -1).to("cpu", torch.float64),
                outputs.reshape(x.shape[0], -1).to("cpu", torch.float64))

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """The summary now, before Lightning's teardown can lose it (a SIGTERM after it
        restored the default handler); ``on_fit_end`` refreshes it."""
        self.output.bind(trainer).end_training(lambda: self.on_fit_end(trainer, pl_module))

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        """SIGTERM / SIGINT: the summary of what was measured (``run_status``: ``interrupted at
        step N``), and an exit code that is not 0 (:mod:`audit_callbacks.callbacks.interrupt`)."""
        self.output.on_exception(trainer, exception,
                                 lambda status: self.on_fit_end(trainer, pl_module, status=status))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any, status: str = "complete") -> None:
        self.output.bind(trainer)
        self.output.summary_filename = self.summary_filename
        path = self.output.finish(self.summary(pl_module, status), status)
        if path is not None:
            self.summary_path = path

    def _means(self) -> dict[str, float | None]:
        """The published running means over the attacked examples (None where none)."""
        p = self.published
        return {
            names.ACCURACY: p["correct"] / p["attacked_examples"] if p["attacked_examples"] else None,
            names.ACCURACY_NOISED: p["correct_noised"] / p["noised_examples"] if p["noised_examples"] else None,
            names.EXPECTED_ACCURACY_NOISED: p["expected"] / p["expected_examples"] if p["expected_examples"] else None,
        }

    @property
    def accuracy(self) -> float | None:
        """Noise-free attack accuracy over the attacked examples of the published blocks
        (None before the first block of ``min_examples``)."""
        return self._means()[names.ACCURACY]

    def coverage(self) -> tuple[dict[str, int], str]:
        """Which attacked clients the published accuracies cover: the accuracy's ``counts``
        (client counts only, no example count of the unpublished clients: that would be their
        dataset sizes) and its status.

        ``n``: the clients whose examples are in the published sums; ``attacked_clients``: every
        client attacked; ``clients_dropped_at_resume``: clients attacked after the last published
        block before a checkpoint that a fit resumed from (a checkpoint keeps only the published
        sums, so their examples are in no accuracy). The rest were attacked after the last
        complete block of ``min_examples`` examples (not yet published). The status is ``ok``,
        or where a resume dropped clients, says how many of the attacked clients are covered."""
        covered = int(self.published[names.ATTACKED_CLIENTS])
        dropped = self.attacked_clients - int(self.totals[names.ATTACKED_CLIENTS])
        counts = {"n": covered, "attacked_examples": int(self.published["attacked_examples"]),
                  names.ATTACKED_CLIENTS: self.attacked_clients, "clients_dropped_at_resume": dropped}
        status = "ok" if not dropped else (
            f"covers {covered} of the {self.attacked_clients} attacked clients: the examples of {dropped} attacked "
            f"before a resume, after the checkpoint's last complete block, were dropped (a checkpoint keeps "
            f"only the published sums)")
        return counts, status

    def summary(self, pl_module: Any = None, status: str = "complete") -> dict[str, Any]:
        """The summary JSON's content (the one schema: :mod:`audit_callbacks.auditing.output`;
        the keys of before kept beside ``inputs`` and ``results``). ``attacked_clients`` counts
        every client attacked in the fit and the fits it resumed; the accuracy's ``counts`` and
        status (:meth:`coverage`) say which of them the published accuracies cover."""
        acc = self.accuracy
        counts, coverage = self.coverage()
        delta = self.delta if self.delta is not None else float(getattr(pl_module, "delta", 1e-5) or 1e-5)
        noise = self.rounds[-1].get("noise_multiplier") if self.rounds else None
        single = self.rounds[-1].get(names.EPSILON_SINGLE_ROUND) if self.rounds else None
        none = "no client was attacked"
        results = {
            names.ACCURACY: result_entry(acc, reason=none if not self.attacked_clients else
                                         f"fewer than min_examples = {self.min_examples} examples attacked",
                                         method="noise-free last-layer label attack", source=SOURCE,
                                         counts=counts, status=coverage),
            names.EPSILON_LOWER_BOUND_MAX: result_entry(
                self.running_max if self.attacked_clients else None, reason=none, delta=delta,
                method="max over attacked clients", source=SOURCE, counts={"n": self.attacked_clients}),
            names.EPSILON_SINGLE_ROUND: result_entry(single, reason=none, delta=delta,
                                                    method="gaussian mechanism, one round", source=SOURCE),
        }
        return summary_document(
            "FederatedLabelAttack", run_status=status, source=SOURCE,
            status="ok" if self.attacked_clients else f"not attacked: {none}",
            inputs={"delta": delta, "noise_multiplier": noise, "seed": self.seed,
                    "requested_noise_multiplier": self.noise_multiplier, "min_examples": self.min_examples},
            results=results,
            threat_model="server without secure aggregation sees each FedSGD client's clipped update, the "
                         "global model and the client's features",
            attacked_clients=self.attacked_clients, accuracy=acc, delta=delta, noise_multiplier=noise,
            noise_multiplier_is_the_release=self.noise_multiplier is None or float(self.noise_multiplier) == float(
                getattr(pl_module, "noise_multiplier", float("nan"))),
            epsilon_lower_bound_max=self.running_max, flipped_clip_factors=self.flipped_clip,
            epsilon_single_round=single, skipped=dict(self.skips),
            # per-round aggregates only: no per-client row (a real client's id, dataset size and
            # attack accuracy are that client's data)
            rounds=self.rounds)

    def _section(self) -> ReportSection:
        return ReportSection(*self.report_section())

    def report_section(self) -> tuple[str, dict[str, Any]]:
        """This audit's results for the audit report (written once every audit of the run
        finished)."""
        return ("federated label attack (Yuan, Xue, Wang, Shen 2022)", {
            "status": "ok" if self.attacked_clients else "not attacked: no client was attacked",
            names.ACCURACY: self.accuracy, "num_classes": self.num_classes,
            names.ATTACKED_CLIENTS: self.attacked_clients,
            names.EPSILON_LOWER_BOUND_MAX: self.running_max if self.attacked_clients else None,
            names.EPSILON_SINGLE_ROUND: self.rounds[-1].get(names.EPSILON_SINGLE_ROUND) if self.rounds else None,
            "skipped": dict(self.skips), "source": SOURCE})

    def state_dict(self) -> dict[str, Any]:
        """The checkpointed state: aggregates only (per-round means, the attacked-client count
        and accuracy sum, the skips, the running maximum) and the attack's generator; no row of
        a real client (``history`` starts empty after a resume)."""
        return {names.ATTACKED_CLIENTS: self.attacked_clients, "published": dict(self.published),
                "rounds": [dict(r) for r in self.rounds],
                "skips": dict(self.skips), "running_max": self.running_max, "generator": self._gen.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = []
        self.attacked_clients = int(state_dict.get(names.ATTACKED_CLIENTS, 0))
        self.published = {k: float(state_dict.get("published", {}).get(k, 0.0)) for k in _TOTALS}
        self.totals = dict(self.published)  # the examples since the last block start again
        self.rounds = [dict(r) for r in state_dict.get("rounds", [])]
        self.skips = Counter({str(k): int(v) for k, v in state_dict.get("skips", {}).items()})
        self.running_max = float(state_dict.get("running_max", 0.0))
        if "generator" in state_dict:
            self._gen.set_state(state_dict["generator"])
