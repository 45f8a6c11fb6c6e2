"""A character-level language model (a GRU) on a text file: plain PyTorch, one fit call.

Each sample is a window of T characters and the same window shifted by one, so the model learns
to predict every next character at once. The loss and the metric are the script's own: the
model's output is (N, T, V), which the built-in classification loss does not take.

    python examples/char_lm.py --text book.txt                              # one process
    horovodrun -np 2 --gloo python examples/char_lm.py                      # sync, 2 workers
    mpirun -np 3 python examples/char_lm.py --mode async                    # 2 workers + 1 server

Without --text it trains on a few paragraphs of public-domain prose built into this file, a text
so short that the model soon learns it by heart: the training loss goes on falling while the
test loss (on the held-out last tenth) turns up after a few epochs. A book shows more.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

import hvdtrain

# Dickens (1859), Austen (1813), Melville (1851), Lincoln (1863), the Declaration of
# Independence (1776), Genesis (King James Version, 1611) and Carroll (1865): public domain.
CORPUS = """\
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age
of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season
of Light, it was the season of Darkness, it was the spring of hope, it was the winter of
despair, we had everything before us, we had nothing before us, we were all going direct to
Heaven, we were all going direct the other way - in short, the period was so far like the
present period, that some of its noisiest authorities insisted on its being received, for good
or for evil, in the superlative degree of comparison only.

It is a truth universally acknowledged, that a single man in possession of a good fortune, must
be in want of a wife. However little known the feelings or views of such a man may be on his
first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding
families, that he is considered the rightful property of some one or other of their daughters.

Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in
my purse, and nothing particular to interest me on shore, I thought I would sail about a little
and see the watery part of the world. It is a way I have of driving off the spleen and
regulating the circulation. Whenever I find myself growing grim about the mouth; whenever it is
a damp, drizzly November in my soul; whenever I find myself involuntarily pausing before coffin
warehouses, and bringing up the rear of every funeral I meet; then, I account it high time to
get to sea as soon as I can.

Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we
are engaged in a great civil war, testing whether that nation, or any nation so conceived and so
dedicated, can long endure. We are met on a great battle-field of that war. We have come to
dedicate a portion of that field, as a final resting place for those who here gave their lives
that that nation might live. It is altogether fitting and proper that we should do this. But,
in a larger sense, we can not dedicate - we can not consecrate - we can not hallow - this
ground. The brave men, living and dead, who struggled here, have consecrated it, far above our
poor power to add or detract. The world will little note, nor long remember what we say here,
but it can never forget what they did here. It is for us the living, rather, to be dedicated
here to the unfinished work which they who fought here have thus far so nobly advanced.

When in the Course of human events, it becomes necessary for one people to dissolve the
political bands which have connected them with another, and to assume among the powers of the
earth, the separate and equal station to which the Laws of Nature and of Nature's God entitle
them, a decent respect to the opinions of mankind requires that they should declare the causes
which impel them to the separation. We hold these truths to be self-evident, that all men are
created equal, that they are endowed by their Creator with certain unalienable Rights, that
among these are Life, Liberty and the pursuit of Happiness.

In the beginning God created the heaven and the earth. And the earth was without form, and
void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of
the waters. And God said, Let there be light: and there was light. And God saw the light, that
it was good: and God divided the light from the darkness. And God called the light Day, and the
darkness he called Night. And the evening and the morning were the first day.

Alice was beginning to get very tired of sitting by her sister on the bank, and of having
nothing to do: once or twice she had peeped into the book her sister was reading, but it had no
pictures or conversations in it, 'and what is the use of a book,' thought Alice 'without
pictures or conversations?' So she was considering in her own mind (as well as she could, for
the hot day made her feel very sleepy and stupid), whether the pleasure of making a
daisy-chain would be worth the trouble of getting up and picking the daisies, when suddenly a
White Rabbit with pink eyes ran close by her.
"""


def corpus_file() -> Path:
    """The built-in corpus as a text file, so that the script reads a file either way. Every
    process writes it at once: each writes its own copy and renames it into place (atomic), so
    no process reads a half-written file, and the copies are the same."""
    path = Path(tempfile.gettempdir()) / "hvdtrain-char-lm-corpus.txt"
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(CORPUS, encoding="utf-8")
    os.replace(staging, path)
    return path


class CharWindows(Dataset):
    """(x, y) pairs of T character ids, y being x shifted by one character. Windows start every
    `stride` characters: overlapping windows give a short text many samples.

    Defined at module level: with --data-workers the DataLoader's processes receive it pickled.
    """

    def __init__(self, ids: torch.Tensor, block: int, stride: int):
        if len(ids) < block + 1:
            raise ValueError(f"the text has {len(ids)} characters, fewer than a window of "
                             f"{block + 1}; use a longer text or a smaller --block")
        self.ids, self.block, self.stride = ids, block, stride

    def __len__(self) -> int:
        return (len(self.ids) - self.block - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.stride
        chunk = self.ids[start:start + self.block + 1]
        return chunk[:-1].clone(), chunk[1:].clone()  # clone: no view pins the whole text


class CharGRU(nn.Module):
    def __init__(self, vocab_size: int, embed: int = 64, hidden: int = 128, dropout: float = 0.2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.dropout = nn.Dropout(dropout)  # a short text is soon learnt by heart
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.step(ids)[0]  # (N, T) ids -> (N, T, V) logits

    def step(self, ids: torch.Tensor, state: torch.Tensor | None = None):
        """Logits and the GRU's state, which generation carries from one character to the next."""
        out, state = self.gru(self.embed(ids), state)
        return self.head(self.dropout(out)), state


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy of every position: (N, T, V) logits against (N, T) ids, the mean of N*T."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def next_char_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(characters predicted right, characters): a sum and a count, so that hvdtrain can add
    them across batches and workers before it divides."""
    return (logits.argmax(dim=-1) == targets).sum(), targets.numel()


@torch.no_grad()
def generate(model: CharGRU, vocab: str, prompt: str, length: int, temperature: float = 0.8,
             seed: int = 0) -> str:
    lookup = {c: i for i, c in enumerate(vocab)}
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    model.eval()  # no dropout while generating
    ids = torch.tensor([[lookup[c] for c in prompt]], device=device)
    logits, state = model.step(ids)
    text = prompt
    for _ in range(length):
        probs = torch.softmax(logits[0, -1] / temperature, dim=-1)
        next_id = torch.multinomial(probs, 1, generator=generator)
        text += vocab[next_id.item()]
        logits, state = model.step(next_id.view(1, 1), state)
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", type=Path, default=None,
                        help="a UTF-8 text file (default: the built-in corpus)")
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's, per worker; scaled by "
                                                               "the number of workers")
    parser.add_argument("--block", type=int, default=64, help="characters per window (T)")
    parser.add_argument("--stride", type=int, default=4,
                        help="characters between training windows: a small stride gives a short "
                             "text many samples, a long one needs less")
    parser.add_argument("--hidden", type=int, default=128, help="GRU state size")
    parser.add_argument("--data-workers", type=int, default=0,
                        help="DataLoader processes per worker (0: read in the training process)")
    parser.add_argument("--max-steps-per-epoch", type=int, default=0,
                        help="cut each epoch short, for quick runs (0: whole epochs)")
    parser.add_argument("--run-dir", default=None, help="where the log and checkpoint go")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    text = (args.text or corpus_file()).read_text(encoding="utf-8")
    vocab = "".join(sorted(set(text)))
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.int64)
    cut = int(len(ids) * 0.9)  # the last tenth is held out, whole windows without overlap
    train = CharWindows(ids[:cut], args.block, args.stride)
    test = CharWindows(ids[cut:], args.block, args.block)

    result = hvdtrain.fit(
        lambda: CharGRU(len(vocab), hidden=args.hidden), train, test,
        loss=next_char_loss, metrics={"char_acc": next_char_accuracy},
        mode=args.mode, epochs=args.epochs, batch_size=args.batch_size,
        optimizer="adam", lr=args.lr, data_workers=args.data_workers,
        max_steps_per_epoch=args.max_steps_per_epoch, run_dir=args.run_dir, seed=args.seed)

    # Every process gets the same result; the launcher's rank picks the one that prints.
    if int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0))) == 0:
        first, final = result.history[0], result.final
        prompt = " ".join(text.split()[:3]) + " "  # the text's first words
        print(f"sample: {generate(result.model, vocab, prompt, 160)!r}")
        print(f"final: epoch={final['epoch']} train_loss {first['train_loss']:.3f} -> "
              f"{final['train_loss']:.3f}, test_loss={final['test_loss']:.3f} "
              f"perplexity={math.exp(final['test_loss']):.2f} "
              f"test_char_acc={final['test_char_acc']:.3f} ({final['wall_seconds']:.1f}s, "
              f"log: {result.log_path})")


if __name__ == "__main__":  # loader processes import this file; they must not train
    main()
