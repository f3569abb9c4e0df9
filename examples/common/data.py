"""Data the examples generate themselves (nothing is downloaded).

- `ByteTokenizer`: UTF-8 bytes as token ids 0..255, the vocabulary of the tiny
  language-model configs, so text prompts work without a tokenizer file.
- `arithmetic_corpus`: lines like ``"37+5=42\\n"``, a character-level text with
  structure a small model learns within a few dozen steps.
- `LMBatches`: random windows of a token stream as (inputs, targets) pairs.

All randomness comes from a CPU `torch.Generator`, so the same seed gives the
same batches whatever device the model runs on.
"""

from __future__ import annotations

import torch


class ByteTokenizer:
    vocab_size = 256
    eos_id = ord("\n")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def arithmetic_corpus(n_lines: int = 4000, seed: int = 1234, max_operand: int = 99) -> str:
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, max_operand + 1, (n_lines,), generator=g).tolist()
    b = torch.randint(0, max_operand + 1, (n_lines,), generator=g).tolist()
    return "".join(f"{x}+{y}={x + y}\n" for x, y in zip(a, b))


class LMBatches:
    """Random (B, T) windows of `tokens`; targets are the inputs shifted by one."""

    def __init__(self, tokens, batch_size: int, seq_len: int, seed: int = 0, device="cpu"):
        self.tokens = torch.as_tensor(tokens, dtype=torch.long)
        if self.tokens.numel() <= seq_len + 1:
            raise ValueError("token stream shorter than one window")
        self.batch_size, self.seq_len, self.device = batch_size, seq_len, device
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, step=None):
        starts = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (self.batch_size,),
                               generator=self.gen)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        window = self.tokens[idx]
        x, y = window[:, :-1], window[:, 1:]
        return x.to(self.device), y.to(self.device)
