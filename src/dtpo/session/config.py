"""The Session's settings, validated where they are declared."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.dist.wrap import STRATEGIES
from dtpo.session.precision import PRECISIONS


@dataclass
class SessionConfig:
    """How a :class:`~dtpo.session.session.Session` trains and measures.

    Attributes:
        precision: ``"32-true"``, ``"bf16-mixed"`` (autocast to bfloat16) or ``"16-mixed"`` (autocast to
            float16 with a gradient scaler), as in Lightning.
        strategy: ``"ddp"`` (DistributedDataParallel) or ``"fsdp"`` (FSDP2 ``fully_shard``).
        grad_accum: Micro-batches per optimizer step; gradients sync only on the last one.
        warmup_steps: Optimizer steps left out of totals (DDP rebuilds buckets after the first iteration;
            the first step also counts FLOPs).
        max_grad_norm: Clip gradients to this total norm before each optimizer step, if set.
        count_flops: Count model FLOPs on the first step with ``torch.utils.flop_counter`` (for MFU).
        flush_every: Write this rank's partial record every N steps, so a crash leaves data behind.
    """

    precision: str = "32-true"
    strategy: str = "ddp"
    grad_accum: int = 1
    warmup_steps: int = 2
    max_grad_norm: float | None = None
    count_flops: bool = True
    flush_every: int = 50

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r} (choose from: {', '.join(PRECISIONS)})")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r} (choose from: {', '.join(STRATEGIES)})")
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {self.grad_accum!r}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.flush_every < 1:
            raise ConfigError(f"flush_every must be >= 1, got {self.flush_every}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)
