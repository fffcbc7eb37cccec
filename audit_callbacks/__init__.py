"""audit-callbacks: PyTorch Lightning callbacks that audit privacy while a model trains.

Layers, from the training down to the numbers:
    callbacks   Lightning front ends: CanaryAudit (DP-FedAvg and Opacus DP-SGD),
                LabelReconstructionAttack, LabelDPLowerBound, FederatedLabelAttack, LDPAudit,
                LDPInferenceAudit
    plain       the front end of a plain-PyTorch Opacus loop: OpacusCanaryAudit
    flower      the Flower front end and backend: CanaryStrategy
    federated   DP-FedAvg as a LightningModule (DPFedAvg) and the round's stages
    backends    how canaries enter a kind of training: fedavg, opacus/ (optimizer discovery and
                hook chaining, accounting, canary placement, the injector, loader sampling)
    canary      the canary vectors and every canary statistic, on the model's device
    auditing    the auditor, the report, the output path (summary, report, sinks, files)
    estimators  numpy/scipy only: epsilon estimates, valid lower bounds, intervals, label DP
    attacks     torch attacks without Lightning (label reconstruction, the epsilon0 test)
    mechanisms  local randomizers (LDP-SGD, two-point, staircase SRR, GRR, Gaussian)
    names       the name table: every logged quantity's name, tag, JSON key and chart
    compat      both Lightning namespaces; DPFedAvg for the standalone pytorch_lightning
    validation  argument checks shared by every public entry point
"""

__version__ = "0.1.0"
