"""A user's own language model, given as files: --model tests/helpers/user/tiny_lm.py:build,
--dataset tests/helpers/user/tiny_lm.py:corpus and --loss tests/helpers/user/tiny_lm.py:token_loss.
A tiny GPT (token and position embeddings, one causal self-attention block, a head over the
vocabulary) on the public-domain text of examples/char_lm.py, one character a token. Its output
is (N, T, V), so the built-in accuracy does not apply: its runs report test_loss alone, the case
``hvdtrain compare --target test_loss<=X`` is for."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

BLOCK = 32   # tokens of context
STRIDE = 8   # characters between training windows


def _text() -> str:
    """examples/char_lm.py's built-in corpus (loaded by path: examples/ is not a package)."""
    path = Path(__file__).resolve().parents[3] / "examples" / "char_lm.py"
    spec = importlib.util.spec_from_file_location("char_lm_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CORPUS


VOCAB = sorted(set(_text()))


def _windows(ids: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = range(0, len(ids) - BLOCK - 1, stride)
    x = torch.stack([ids[s:s + BLOCK] for s in starts])
    y = torch.stack([ids[s + 1:s + BLOCK + 1] for s in starts])
    return x, y


def corpus():
    """(train, test) as (x, y) pairs of (N, BLOCK) token ids, y being x shifted by one; the
    last tenth of the text is the test split, in windows that do not overlap."""
    lookup = {c: i for i, c in enumerate(VOCAB)}
    ids = torch.tensor([lookup[c] for c in _text()], dtype=torch.int64)
    cut = int(len(ids) * 0.9)
    return _windows(ids[:cut], STRIDE), _windows(ids[cut:], BLOCK)


def corpus_without_test():
    """The training split alone (no test split: nothing to evaluate a target on)."""
    return corpus()[0], None


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int = 32, heads: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(BLOCK, width)
        self.block = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.head = nn.Linear(width, vocab)
        mask = torch.triu(torch.full((BLOCK, BLOCK), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        return self.head(self.block(h, src_mask=self.causal[:t, :t]))  # (N, T, V) logits


def build(width: int = 32) -> nn.Module:
    return TinyGPT(len(VOCAB), width)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy of every next token: (N, T, V) logits against (N, T) ids."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
