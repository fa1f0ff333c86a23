"""The in-process agent of ``dtpo launch``: per-step measurement and tuning of a script that does not use dtpo.

``dtpo launch`` puts ``boot/sitecustomize.py`` first on its workers' ``PYTHONPATH``; it wakes
:mod:`~dtpo.agent.activation` (inert unless the launcher asked), which waits for ``import torch``
(:mod:`~dtpo.core.post_import`), hooks torch's optimizer, data-loader, backward and DDP calls
(:mod:`~dtpo.agent.torch_hooks`), tells iterations and training batches apart (:mod:`~dtpo.agent.step_counter`),
cuts steps (:mod:`~dtpo.agent.tracker`) and feeds them to :class:`~dtpo.agent.run.AgentRun`, a producer of the
step stream, whose collectives go over a group of its own (:mod:`~dtpo.agent.channel`).
"""

from pathlib import Path

BOOT_DIR = Path(__file__).resolve().parent / "boot"
"""The folder ``dtpo launch`` puts first on its workers' ``PYTHONPATH`` (it holds only ``sitecustomize.py``)."""
