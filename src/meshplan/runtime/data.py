"""Training data: a seeded synthetic stream and a small byte-level text corpus.

Every batch is a pure function of (seed, step): any layout, world size or restart sees the same global batch, and
each rank takes its slice of it. That is what lets a multi-rank loss match a single-process reference exactly and a
resumed run continue exactly where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from meshplan.errors import SpecError

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"


def encode(text: str) -> torch.Tensor:
    """Byte-level tokenizer: UTF-8 bytes as token ids 0..255."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """Inverse of encode (invalid UTF-8 sequences are replaced)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


@dataclass(frozen=True, kw_only=True)
class Source:
    """A batch source: ``kind`` is ``synthetic``, ``corpus`` (the shipped text) or a path to a text file."""

    kind: str
    """Data source name or text-file path."""
    vocab: int
    """Model vocabulary (token ids must stay below it)."""
    seed: int = 0
    """Seed of the stream; batches depend on (seed, step) only."""

    def __post_init__(self) -> None:
        if self.kind != "synthetic" and self.vocab < 256:
            raise SpecError("--data", self.kind, f"byte-level text needs vocab >= 256, the model has {self.vocab}")
        if self.kind not in ("synthetic", "corpus") and not Path(self.kind).is_file():
            raise SpecError("--data", self.kind, "must be 'synthetic', 'corpus' or a text file")

    def check(self, *, seq_len: int) -> None:
        """Raise SpecError unless every batch of ``seq_len`` tokens can be cut from the text (checked once, before
        any rank reads it)."""
        if self.kind == "synthetic":
            return
        try:
            n = len((CORPUS if self.kind == "corpus" else Path(self.kind)).read_text().encode("utf-8"))
        except UnicodeDecodeError as exc:
            raise SpecError("--data", self.kind, f"is not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise SpecError("--data", self.kind, f"cannot be read: {exc.strerror}") from None
        if n <= seq_len + 1:
            raise SpecError("--data", self.kind, f"has {n} bytes, needs more than seq_len+1 = {seq_len + 1}")

    def batch(self, *, step: int, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of ``step``: (inputs, targets), each [batch, seq_len] int64, targets shifted by one."""
        g = _generator(self.seed, step)
        if self.kind == "synthetic":
            # Arithmetic progressions mod vocab with a random start and stride: learnable, so the loss falls.
            start = torch.randint(0, self.vocab, (batch, 1), generator=g)
            stride = torch.randint(1, 8, (batch, 1), generator=g)
            seqs = (start + stride * torch.arange(seq_len + 1)[None]) % self.vocab
        else:
            text = CORPUS.read_text() if self.kind == "corpus" else Path(self.kind).read_text()
            ids = encode(text)
            if len(ids) <= seq_len + 1:
                raise SpecError("--data", self.kind, f"has {len(ids)} bytes, needs more than seq_len+1")
            offsets = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=g)
            seqs = torch.stack([ids[o:o + seq_len + 1] for o in offsets.tolist()])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def dp_slice(t: torch.Tensor, *, dp_rank: int, dp: int) -> torch.Tensor:
    """This data-parallel rank's contiguous share of the global batch (dim 0)."""
    n = t.shape[0] // dp
    return t[dp_rank * n:(dp_rank + 1) * n]


def replica_rows(shares: tuple[int, ...], *, dp_rank: int, micro_batch: int) -> slice:
    """Rows of the global batch that replica ``dp_rank`` trains when replica d runs ``shares[d]`` micro-batches
    (``spec.checks.replica_shares``): contiguous, in dp order, so every replica's rows together are the batch."""
    start = sum(shares[:dp_rank]) * micro_batch
    return slice(start, start + shares[dp_rank] * micro_batch)


def cp_positions(seq_len: int, *, cp_rank: int, cp: int, zigzag: bool = True) -> torch.Tensor:
    """Token positions a context-parallel rank holds. zigzag (ring attention): load-balanced for causal attention,
    the sequence is cut in 2*cp chunks and rank r holds chunks r and 2*cp-1-r. Otherwise (all-to-all attention,
    which sees the whole sequence anyway) rank r holds contiguous chunk r."""
    if cp == 1:
        return torch.arange(seq_len)
    if not zigzag:
        return torch.arange(seq_len).chunk(cp)[cp_rank]
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]])
