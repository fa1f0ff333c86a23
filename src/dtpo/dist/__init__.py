"""Engines dtpo wraps and never replaces: torchrun's launcher, process groups, DDP and FSDP2."""
