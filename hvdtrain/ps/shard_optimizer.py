"""The server-side optimizer: torch's own SGD / Adam / AdamW update rules, applied to a range of
one contiguous parameter shard.

It calls torch's functional optimizers (``torch.optim.sgd.sgd``, ``torch.optim.adam.adam``...) on
views of flat state tensors rather than going through ``torch.optim.Optimizer.step``. The
arithmetic is the library's, identical to what sync training runs on the workers, but this path
does not import torch._dynamo at the first step (about 70 MiB of server memory) and has no
per-call bookkeeping, which matters when a 16 MiB push is applied in 16 chunks. The update is
memory-bound, so the fused kernels (one pass over all the vectors) are used where they exist.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from ..config import OptimConfig

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, as sync training uses


class ShardOptimizer:
    """``outer``: asynchronous DiLoCo's outer step (rules/local_sgd.OuterStep), which replaces
    --optimizer: SGD with Nesterov momentum on each pushed pseudo-gradient, its momentum
    updated every ``outer.every`` pushes (Delayed Nesterov)."""

    def __init__(self, params: torch.Tensor, chunks: list[tuple[int, int]], cfg: OptimConfig,
                 outer=None):
        self.params = params
        self.chunks = chunks
        self.cfg = cfg
        self.outer = outer
        self.vectors: dict[str, torch.Tensor] = {}  # per-element state, same length as params
        self.steps: list[torch.Tensor] = []         # Adam's step count, one per chunk
        self.pushes = [0] * len(chunks)  # Delayed Nesterov: pushes applied, per chunk
        if outer is not None:
            if outer.momentum:
                self.vectors["momentum_buffer"] = torch.zeros_like(params)
            if outer.momentum and outer.every > 1:  # the pushes since the momentum's update
                self.vectors["delayed_sum"] = torch.zeros_like(params)
        elif cfg.optimizer == "sgd":
            if cfg.momentum:
                # Zeros give the same first step as torch's clone-of-the-gradient: 0*m + g = g.
                self.vectors["momentum_buffer"] = torch.zeros_like(params)
        else:
            self.vectors["exp_avg"] = torch.zeros_like(params)
            self.vectors["exp_avg_sq"] = torch.zeros_like(params)
            # on the parameters' device: the fused CUDA kernel reads it there
            self.steps = [torch.tensor(0.0, device=params.device) for _ in chunks]

    def apply(self, chunk: int, grad: torch.Tensor, lr: float) -> None:
        """Update chunk ``chunk`` of the parameters with its gradient."""
        a, b = self.chunks[chunk]
        cfg = self.cfg
        if self.outer is not None:
            self._outer(chunk, a, b, grad, lr)
            return
        if cfg.optimizer == "sgd":
            buf = self.vectors.get("momentum_buffer")
            # torch's fused CPU kernel makes one pass over parameters, gradient and momentum
            # instead of one per operation; with no momentum there is one pass anyway and the
            # plain path is quicker.
            fused = {"fused": True} if buf is not None else {"foreach": False}
            sgd([self.params[a:b]], [grad], [buf[a:b] if buf is not None else None],
                **fused, weight_decay=cfg.weight_decay, momentum=cfg.momentum, lr=lr,
                dampening=0.0, nesterov=False, maximize=False)
            return
        rule = adam if cfg.optimizer == "adam" else adamw
        rule([self.params[a:b]], [grad], [self.vectors["exp_avg"][a:b]],
             [self.vectors["exp_avg_sq"][a:b]], [], [self.steps[chunk]], fused=True,
             amsgrad=False, beta1=ADAM_BETAS[0], beta2=ADAM_BETAS[1], lr=lr,
             weight_decay=cfg.weight_decay, eps=ADAM_EPS, maximize=False)

    def _outer(self, chunk: int, a: int, b: int, grad: torch.Tensor, lr: float) -> None:
        """The outer Nesterov step on pseudo-gradient ``grad`` (g). Every ``every``-th push:
        m <- beta m + mean of the pushes since the last update (this one included), then
        theta <- theta - lr (g + beta m); other pushes: theta <- theta - lr g. With every = 1
        this is torch's Nesterov SGD (dampening 0), which runs it."""
        momentum, every = self.outer.momentum, self.outer.every
        buf = self.vectors.get("momentum_buffer")
        if buf is None or every == 1:
            sgd([self.params[a:b]], [grad], [buf[a:b] if buf is not None else None],
                foreach=False, weight_decay=0.0, momentum=momentum, lr=lr, dampening=0.0,
                nesterov=buf is not None, maximize=False)
            return
        self.pushes[chunk] += 1
        params, buf, pending = self.params[a:b], buf[a:b], self.vectors["delayed_sum"][a:b]
        pending.add_(grad)
        if self.pushes[chunk] % every:
            params.add_(grad, alpha=-lr)
            return
        buf.mul_(momentum).add_(pending, alpha=1.0 / every)
        pending.zero_()
        params.add_(grad, alpha=-lr).add_(buf, alpha=-lr * momentum)

    # --- checkpoints ---------------------------------------------------------------------------
    def scalars(self) -> dict[str, float]:
        if self.outer is not None:  # Delayed Nesterov's place in its cycle of N pushes
            return {"outer_pushes": float(self.pushes[0])}
        return {"step": float(self.steps[0])} if self.steps else {}

    def misfit(self, vectors: dict[str, torch.Tensor], scalars: dict[str, float]) -> str:
        """Why a checkpoint's optimizer state cannot continue this server's step ("" where it
        can): it was another step's (async DiLoCo's outer step against --optimizer's, whose
        momentum_buffer means another thing), or holds state this step does not keep. Where
        this step keeps state that the checkpoint lacks, fresh zeros are that state."""
        was_outer, outer = "outer_pushes" in scalars, self.outer is not None
        if vectors and was_outer != outer:
            steps = ["async DiLoCo's outer step (--local-steps)",
                     f"--optimizer {self.cfg.optimizer} on every push"]
            then, now = (steps if was_outer else steps[::-1])
            return f"the checkpoint's server ran {then}, and this run's runs {now}"
        unused = [name for name in vectors if name not in self.vectors]
        if unused:
            uses = (f"--optimizer {self.cfg.optimizer} with --momentum {self.cfg.momentum:g}"
                    if not outer else f"the outer step with --outer-momentum "
                    f"{self.outer.momentum:g}, --outer-momentum-every {self.outer.every}")
            return (f"the checkpoint holds {', '.join(unused)}, which {uses} does not keep "
                    "(a setting changed since)")
        return ""

    def load(self, vectors: dict[str, torch.Tensor], scalars: dict[str, float]) -> None:
        """The checkpoint's state, where it fits (misfit); else the fresh state stays, and one
        line says why."""
        why = self.misfit(vectors, scalars)
        if why:
            print(f"hvdtrain: a parameter server keeps the checkpoint's parameters with fresh "
                  f"optimizer state: {why}", flush=True)
            return
        for name, value in vectors.items():
            self.vectors[name].copy_(value)
        if "outer_pushes" in scalars:
            self.pushes = [int(scalars["outer_pushes"])] * len(self.chunks)
        if "step" in scalars:
            for step in self.steps:
                step.fill_(scalars["step"])
