"""A small GPT-style byte-level language model trained on Python's own standard library source.

The text ships with every CPython install, so the workload needs no download and reads the same bytes on
every machine running the same Python version.
"""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dtpo.core.errors import ConfigError
from dtpo.workloads.base import Batch, Workload, check_batch_args, rank_seed

VOCAB_SIZE = 256  # raw bytes: no tokenizer to ship or train

# Modules present as plain .py files in every CPython since 3.11 (pathlib is left out: it became a package
# in 3.13). Sorted and fixed so the corpus depends only on the Python version, not on what else is installed.
STDLIB_SOURCES: tuple[str, ...] = tuple(sorted((
    "argparse.py",
    "collections/__init__.py",
    "dataclasses.py",
    "email/_header_value_parser.py",
    "email/_parseaddr.py",
    "email/_policybase.py",
    "email/charset.py",
    "email/feedparser.py",
    "email/generator.py",
    "email/header.py",
    "email/headerregistry.py",
    "email/message.py",
    "email/utils.py",
    "enum.py",
    "functools.py",
    "inspect.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "textwrap.py",
    "typing.py",
)))

# Less text than this means a stripped install, and a corpus the model would memorise rather than learn.
MIN_CORPUS_BYTES = 256 * 1024


@cache
def corpus() -> torch.Tensor:
    """The training text: the bytes of :data:`STDLIB_SOURCES`, concatenated, as a 1-D ``uint8`` tensor.

    Files missing from an unusual install are skipped; read once per process.

    Raises:
        ConfigError: The standard library sources are absent or too small (e.g. a ``.pyc``-only install).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks = [(root / rel).read_bytes() for rel in STDLIB_SOURCES if (root / rel).is_file()]
    text = b"\n".join(chunks)
    if len(text) < MIN_CORPUS_BYTES:
        raise ConfigError(f"workload 'lm' needs Python's standard library sources under {root}, "
                          f"found only {len(text)} bytes")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


@dataclass(frozen=True)
class LMConfig:
    """Shape of :class:`TinyGPT`.

    Attributes:
        n_layer: Number of transformer blocks.
        n_head: Attention heads per block; must divide ``d_model``.
        d_model: Width of the residual stream.
        block_size: Context length in bytes, and the length of every training sequence.
    """

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 128

    def __post_init__(self) -> None:
        for field in ("n_layer", "n_head", "d_model", "block_size"):
            if getattr(self, field) < 1:
                raise ConfigError(f"LMConfig.{field} must be at least 1, got {getattr(self, field)}")
        if self.d_model % self.n_head:
            raise ConfigError(f"LMConfig.d_model ({self.d_model}) must be divisible by n_head "
                              f"({self.n_head})")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over ``x`` of shape ``[B, T, C]``."""
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: attention then a 4x GELU MLP, each around a residual."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` of shape ``[B, T, C]``."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer over bytes with a learned positional embedding and a weight-tied head."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.pos = nn.Embedding(config.block_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init_weights)
        # GPT-2's scaling: keeps the residual stream's variance from growing with depth.
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-byte logits ``[B, T, 256]`` for byte ids ``idx`` of shape ``[B, T]`` (``T <= block_size``)."""
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class CharLM(Workload):
    """Next-byte prediction on standard-library source with :class:`TinyGPT`.

    Args:
        config: Model shape; the default is sized for about 0.2 s per step on one CPU thread.
    """

    name: ClassVar[str] = "lm"
    description: ClassVar[str] = "small GPT on the bytes of Python's standard library source"
    default_steps: ClassVar[int] = 350
    default_batch_size: ClassVar[int] = 16
    default_lr: ClassVar[float] = 1e-3

    def __init__(self, config: LMConfig | None = None) -> None:
        self.config = config or LMConfig()

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`TinyGPT`."""
        return TinyGPT(self.config)

    def batches(self, batch_size: int, rank: int, world_size: int, seed: int = 0) -> Iterator[Batch]:
        """Random windows of the corpus; targets are the inputs shifted one byte left.

        Raises:
            ConfigError: ``batch_size`` is below 1 or ``rank`` is outside ``[0, world_size)``.
        """
        check_batch_args(batch_size, rank, world_size)
        text = corpus()
        span = self.config.block_size + 1
        generator = torch.Generator().manual_seed(rank_seed(seed, rank))
        offsets = torch.arange(span)

        def endless() -> Iterator[Batch]:
            while True:
                starts = torch.randint(0, len(text) - span + 1, (batch_size, 1), generator=generator)
                windows = text[starts + offsets].long()
                yield windows[:, :-1], windows[:, 1:]

        return endless()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy over every position of every sequence."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
