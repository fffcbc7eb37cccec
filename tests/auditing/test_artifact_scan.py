"""Every artifact of a run holds no label oracle and no real client's data (issue 26.6).

A run's artifacts are what an outsider may read: TensorBoard event files (scalars, text,
tensors, hparams), the summary JSON files, hparams.yaml and the checkpoints. Each test runs
the callbacks, reads every artifact back (EventAccumulator, json, yaml, torch.load) and looks
for what must not be there:

* the label attack's per-step accuracy against the true labels (with the batch size it tells
  which of the attack's own guesses were right): no ``accuracy_batch`` tag or key, no
  ``history`` rows, and the logged ``label_attack/accuracy`` changes only after a block of at
  least ``min_examples`` attacked examples;
* a real client's id, dataset size, norms or cosines (federated label attack, LDP audit), or
  the cohort's un-noised mean local loss (DP-FedAvg): no such key anywhere.

Names are matched by pattern: a key or a tag's last segment is private when it IS a forbidden
name or starts with one followed by ``_`` (``norm_g1_benign``, ``client_loss_step``), unless it
is one of the aggregates of :data:`AGGREGATES` (issue 37: an exact comparison let
``ldp/norm_g1_<adversary>`` and ``train/client_loss`` through).
"""

import csv
import glob
import importlib.util
import json
import os

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from audit_callbacks.callbacks import LabelDPLowerBound, LabelReconstructionAttack
from audit_callbacks.callbacks.federated_label_attack import FederatedLabelAttack
from audit_callbacks.callbacks.ldp_audit import LDPAudit
from audit_callbacks.federated import DPFedAvg
from audit_callbacks.mechanisms import TwoPoint
from datamodules import FederatedDataModule
from datamodules.central import CentralDataModule
from models import MLP
from models.dpsgd import DPSGDClassifier
from tests._federated import fit

pytestmark = pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG|"
                                        "step skipped|dirpath).*")

#: keys that would carry a per-step label oracle or a real client's data
FORBIDDEN_KEYS = {"accuracy_batch", "batch_size", "history", "count_history", "client", "client_id",
                  "examples", "norm_g1", "norm_g2", "cosine_g1_g2", "client_loss"}
#: names that start with a forbidden one and are aggregates over many clients, none attributed
AGGREGATES = {"client_updates_at_clip", "client_update_norms", "batch_size_variance_ratio"}


def _private(name, allowed=frozenset()):
    """Whether a key or a tag's last segment names a forbidden value (by pattern)."""
    if name in AGGREGATES:
        return False
    return any(name == k or name.startswith(f"{k}_") for k in FORBIDDEN_KEYS - allowed)


def test_the_pattern_catches_qualified_and_suffixed_names():
    """The names issue 37 found in the artifacts: an exact comparison passed them all."""
    for name in ("norm_g1_benign", "norm_g1_collusion", "client_loss_step", "client_loss_epoch",
                 "cosine_g1_g2_label_flip", "accuracy_batch", "client"):
        assert _private(name), name
    for name in ("client_updates_at_clip", "epsilon0_benign", "accuracy", "clip_norm", "loss"):
        assert not _private(name), name


def _walk(obj, path="$"):
    """Yield (path, key) for every dict key of a nested JSON / checkpoint object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield path, k
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")


def _artifacts(root):
    """Everything a run left under ``root``: {path: loaded object}, and the event files' tags."""
    docs, events = {}, {}
    for path in glob.glob(os.path.join(str(root), "**", "*"), recursive=True):
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as fh:
                docs[path] = json.load(fh)
        elif path.endswith(".yaml"):
            with open(path, encoding="utf-8") as fh:
                docs[path] = yaml.safe_load(fh)
        elif path.endswith(".csv"):
            with open(path, encoding="utf-8", newline="") as fh:
                docs[path] = {name: None for name in next(csv.reader(fh), [])}  # its columns
        elif path.endswith(".ckpt"):
            docs[path] = torch.load(path, weights_only=False, map_location="cpu")
        elif os.path.basename(path).startswith("events.out.tfevents"):
            acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
            acc.Reload()
            events[path] = acc
    return docs, events


def _forbidden(docs, events, allowed=frozenset()):
    found = []
    for path, doc in docs.items():
        for where, key in _walk(doc):
            if isinstance(key, str) and _private(key, allowed):
                found.append(f"{path}: {where}.{key}")
    for path, acc in events.items():
        tags = acc.Tags()
        for tag in [*tags["scalars"], *tags["tensors"]]:
            if _private(tag.split("/")[-1].split("_text_summary")[0], allowed):
                found.append(f"{path}: tag {tag}")
    return found


def test_a_label_run_leaves_no_per_step_accuracy_in_any_artifact(tmp_path):
    """Before issue 26: ``label_attack/accuracy_batch`` at every step, and the summary's and the
    checkpoint's ``history`` rows (step, accuracy, batch size)."""
    pl.seed_everything(0, verbose=False)
    dm = CentralDataModule("breast_cancer", batch_size=32, poisson=True, seed=0)
    module = DPSGDClassifier(MLP(30, 1, hidden=(64, 64)), lr=0.3, noise_multiplier=2.0, max_grad_norm=1.0)
    attack = LabelReconstructionAttack(every_n_steps=1)
    bound = LabelDPLowerBound(every_n_steps=1)
    trainer = pl.Trainer(max_epochs=2, logger=TensorBoardLogger(str(tmp_path), name="run", version=0),
                         callbacks=[attack, bound, ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)],
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    assert len(attack.history) >= 20  # in memory only, for the user
    docs, events = _artifacts(tmp_path)
    assert any(p.endswith("label_attack_summary.json") for p in docs)
    assert any(p.endswith(".ckpt") for p in docs) and events
    assert _forbidden(docs, events) == []
    # no training loss (DPSGDClassifier's epoch mean of the un-noised losses over the secret
    # Poisson batches, a release the DP guarantee does not cover): only held-out data's
    assert [t for acc in events.values() for t in acc.Tags()["scalars"]
            if "loss" in t.split("/")[-1] and not t.startswith("val/")] == []
    # the logged accuracy moves only after a block of >= min_examples attacked examples: fewer
    # distinct values than blocks, each an exact aggregate of whole batches
    logged = [e.value for acc in events.values() if "label_attack/accuracy" in acc.Tags()["scalars"]
              for e in acc.Scalars("label_attack/accuracy")]
    assert logged and len(set(logged)) <= attack.attacked_examples // attack.min_examples
    cumulative, prefixes = 0, []
    for _, a, n in attack.history:
        cumulative += round(a * n)
        prefixes.append(cumulative)
    sizes = [n for _, _, n in attack.history]
    totals = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    for value in set(logged):
        # the value is correct / examples over the first k attacked batches, k at a block's end
        assert any(abs(c / t - value) < 1e-6 and t >= attack.min_examples for c, t in zip(prefixes, totals,
                                                                                      strict=True))
    summary = next(d for p, d in docs.items() if p.endswith("label_attack_summary.json"))
    assert summary["accuracy_examples"] >= attack.min_examples
    # the checkpoint's callback state: aggregates only
    ckpt = next(d for p, d in docs.items() if p.endswith("last.ckpt"))
    state = next(v for k, v in ckpt["callbacks"].items() if "LabelReconstructionAttack" in k)
    assert set(state) <= {"steps", "considered", "skips", "latest", "published", "last_reason", "settings",
                          "num_classes", "layer"}  # no example value: a reason code, settings, shapes
    # what is published is whole blocks: the checkpoint's count is a block end, not the last step
    ends = [t for t in totals if t >= attack.min_examples]
    assert state["published"]["attacked"] in totals and state["published"]["attacked"] in ends
    # LabelDPLowerBound's mean P0 (one batch's is a label oracle): per step in memory only;
    # logged, summarized and checkpointed as running means over blocks of >= min_examples
    assert len(bound.p0_history) == bound.attacked_steps
    p0_prefix, p0_sizes = [], []
    for _, m, n in bound.p0_history:
        p0_prefix.append((p0_prefix[-1] if p0_prefix else 0.0) + m * n)
        p0_sizes.append((p0_sizes[-1] if p0_sizes else 0) + n)
    p0_logged = {e.value for acc in events.values() if "label_dp/expected_attack_accuracy" in acc.Tags()["scalars"]
                 for e in acc.Scalars("label_dp/expected_attack_accuracy")}
    assert p0_logged and len(p0_logged) <= p0_sizes[-1] // bound.min_examples
    for value in p0_logged:
        assert any(abs(c / t - value) < 1e-6 for c, t in zip(p0_prefix, p0_sizes, strict=True) if t >= bound.min_examples)
    label_dp = next(d for p, d in docs.items() if p.endswith("label_dp_summary.json"))
    assert not any("expected_attack_accuracy" in r for r in label_dp["records"])
    assert label_dp["results"]["expected_attack_accuracy"]["value"] == pytest.approx(bound.published_expected_attack_accuracy)
    state = next(v for k, v in ckpt["callbacks"].items() if "LabelDPLowerBound" in k)
    assert "p0_totals" not in state and state["p0_published"]["attacked"] in p0_sizes


def test_federated_label_and_ldp_runs_leave_no_real_client_in_any_artifact(tmp_path):
    """Before issue 26: ``federated_label_attack_summary.json`` and its checkpoint held a row per
    attacked client (id, dataset size, noise-free accuracy); LDPAudit's checkpoint kept client
    ids with norms and cosines."""
    dm = FederatedDataModule("digits", num_clients=40, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=(64,)), clients_per_round=5, noise_multiplier=0.5, clip_norm=1.0,
                      local_lr=0.5, local_epochs=1, local_batch_size=1000, sampling="shuffle", seed=0, delta=1e-5)
    attack = FederatedLabelAttack()
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_train_steps=2)
    fit(dm, module, [attack, ckpt], 4, tmp_path / "fl")
    assert attack.history and all("client" in h for h in attack.history)  # in memory, for the user
    docs, events = _artifacts(tmp_path / "fl")
    docs.update(_artifacts(tmp_path / "ckpt")[0])
    assert any(p.endswith("federated_label_attack_summary.json") for p in docs)
    assert _forbidden(docs, events) == []

    dm = FederatedDataModule("digits", num_clients=20, rounds_per_epoch=4, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = DPFedAvg(MLP(64, 10, hidden=()), clients_per_round=5, noise_multiplier=0.0, clip_norm=1.0,
                      local_lr=0.5, local_batch_size=8, sampling="shuffle", seed=0, delta=1e-5,
                      randomizer=TwoPoint(3.0, center=0.0, radius=0.2))
    audit = LDPAudit(trials=200, every_n_rounds=2, seed=0)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ldp_ckpt"), save_last=True, every_n_train_steps=2)
    fit(dm, module, [audit, ckpt], 4, tmp_path / "ldp")
    assert any("client" in r for r in audit.history)  # in memory, for the user
    docs, events = _artifacts(tmp_path / "ldp")
    docs.update(_artifacts(tmp_path / "ldp_ckpt")[0])
    assert any(p.endswith(".ckpt") for p in docs)
    # LDPAudit's summary keeps its public per-audit records under "history" (no client fields)
    assert _forbidden(docs, events, allowed=frozenset({"history"})) == []
    # the checkpointed norm counts are aggregates over every update: no largest norm (one
    # client's value), no gradient adversary's closed form or test seed
    ckpt = next(d for p, d in docs.items() if p.endswith("last.ckpt"))
    state = next(v for k, v in ckpt["callbacks"].items() if "LDPAudit" in k)
    assert set(state["update_norms"]) == {"count", "at_clip", "sum"}
    assert not [r for r in state["history"] if r["adversary"] != "dummy" and {"epsilon0_expected", "seed"} & set(r)]


def test_the_ldp_example_leaves_no_real_example_in_any_artifact(tmp_path):
    """Issue 37 item 2: ``examples/ldp_audit.py`` wrote ``ldp/norm_g1_<adversary>`` to
    TensorBoard and |g1| (with the closed-form value of each pair) to ``ldp_audit.csv``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("ldp_audit_example_scan",
                                                  os.path.join(root, "examples", "ldp_audit.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(["--quick", "--epsilons", "4", "--trials", "500", "--out", str(tmp_path)])
    assert any(r["adversary"] == "benign" and "norm_g1" in r for r in out["results"][0]["records"])  # memory
    docs, events = _artifacts(tmp_path)
    assert any(p.endswith("ldp_audit.csv") for p in docs) and events
    # the summary's per-audit records are public (no client fields); the closed form of a
    # gradient adversary's pair is a function of its norms
    assert _forbidden(docs, events, allowed=frozenset({"history"})) == []
    summary = next(d for p, d in docs.items() if p.endswith("ldp_audit_summary.json"))
    assert summary["inputs"]["seed"] is None and summary["inputs"]["audit_randomness"].startswith("secret")
    for rec in summary["history"]:
        if rec["adversary"] != "dummy":
            assert not {"epsilon0_expected", "seed"} & set(rec["epsilon0"]["details"]), rec
    with open(next(p for p in docs if p.endswith("ldp_audit.csv")), encoding="utf-8") as fh:
        assert "epsilon0_expected" not in fh.readline()


def _load_example(name):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(f"{name}_scan", os.path.join(root, "examples", f"{name}.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_the_demo_leaves_no_real_client_in_any_artifact(tmp_path):
    """``make demo`` (examples/federated_canary_audit.py), a short run: no real client's id,
    size, norm or loss in its summary, report, hparams or TensorBoard events."""
    example = _load_example("federated_canary_audit")
    example.main(["--rounds", "6", "--rounds-per-epoch", "3", "--clients", "40", "--clients-per-round", "8",
                  "--canaries", "40", "--model", "mlp", "--log-dir", str(tmp_path)])
    docs, events = _artifacts(tmp_path)
    assert any(p.endswith("audit_summary.json") for p in docs) and events
    assert _forbidden(docs, events) == []


def test_the_dpsgd_label_example_leaves_no_label_oracle_in_any_artifact(tmp_path):
    """examples/dpsgd_label_audit.py's audited run (--quick): no per-step attack accuracy,
    batch size or example in any artifact."""
    example = _load_example("dpsgd_label_audit")
    args = example.parse_args(["--quick", "--out", str(tmp_path)])
    example.audited_run(args)
    docs, events = _artifacts(tmp_path)
    assert any(p.endswith("_summary.json") for p in docs)
    # the canary statistic's "history" is the accountant's (noise multiplier, rate, steps) runs:
    # the run's public settings, not a per-step record of examples
    found = [f for f in _forbidden(docs, events)
             if not (f.split(":")[0].endswith("audit_summary.json") and f.endswith(".details.history"))]
    assert found == []
    assert [t for acc in events.values() for t in acc.Tags()["scalars"]
            if "loss" in t.split("/")[-1] and not t.startswith("val/")] == []
