"""Engines dtpo wraps and never replaces: torchrun's elastic launcher (:mod:`~dtpo.distributed.launch`), the
process group, DDP and FSDP2 wrapping, gradient-ready stamps and switchable compression in DDP's comm hook, the
link probe, run directories, and Ray Train as a second engine (:mod:`~dtpo.distributed.ray_engine`).
"""
