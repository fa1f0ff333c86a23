"""Checkpoints of a Session through ``torch.distributed.checkpoint`` and resuming from them: when to save,
what, and restoring (:mod:`~dtpo.session.checkpoint.checkpoints`), what a checkpoint is made of (model and
optimizers as one ``Stateful``, each rank's own state: :mod:`~dtpo.session.checkpoint.state`), and the folders on
disk with their ``COMPLETE`` marker, choosing what to resume from and pruning (:mod:`~dtpo.session.checkpoint.files`).
"""
