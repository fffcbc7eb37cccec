"""audit-callbacks: PyTorch Lightning callbacks that audit privacy while a model trains.

Submodules:
    callbacks   the Lightning callbacks: CanaryAudit (DP-FedAvg and Opacus DP-SGD),
                LabelReconstructionAttack, LabelDPLowerBound, LDPAudit, LDPInferenceAudit
    estimators  numpy/scipy estimators (epsilon from cosines, lower bounds, intervals, label-DP
                bounds, error rates, shuffle model)
    attacks     torch attacks without Lightning (label reconstruction, the epsilon-0 test and
                its adversaries, the LDP-FL inference attack)
    mechanisms  local randomizers (LDP-SGD, two-point, staircase SRR, GRR, Gaussian)
    canaries    seeded canaries regenerated chunk by chunk (memory O(d))
    dpsgd       Opacus glue: DPOptimizer, accountant, chained step hook, gradient canaries
    federated   DP-FedAvg as a LightningModule and the audit protocol it calls
    opacus_audit  OpacusCanaryAudit: the canary audit of a plain-PyTorch Opacus loop (no
                Lightning): wraps the DPOptimizer's step; report(), write(log_dir)
"""

__version__ = "0.1.0"
