"""Lightning compatibility: both namespaces (``lightning.pytorch`` and the standalone
``pytorch_lightning``) recognised by class name (:mod:`.namespaces`), and ``DPFedAvg`` on the
standalone namespace (:mod:`.pytorch_lightning`)."""
