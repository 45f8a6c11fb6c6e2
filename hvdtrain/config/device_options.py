"""The options of the device a worker computes on: which, in what precision, compiled or
not, with how many threads, and its peak for the MFU figure."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require
from .values import opt


@dataclass
class DeviceOptions:
    """Where and how each worker computes."""

    device: str = opt("auto", "auto (a GPU per local rank when CUDA is present), cpu or cuda; "
                      "in async mode each worker takes a GPU and the servers stay on the CPU "
                      "unless --server-device says otherwise")
    precision: str = opt("32", "32 (float32), bf16 (autocast to bfloat16, on CPUs and GPUs) or "
                         "fp16 (autocast to float16 with a dynamic loss scale, for GPUs; steps "
                         "whose gradient overflows are skipped). Parameters, gradients and "
                         "optimizer state stay float32", choices=("32", "bf16", "fp16"))
    compile: bool = opt(False, "compile the model (each pipeline stage) with torch.compile; "
                        "the first steps take longer while it compiles")
    threads: int = opt(0, "torch intra-op threads per process (0: cores / processes per host, "
                          "and ranks that no launcher bound get a share of the cores each)")
    deterministic: bool = opt(False, "use deterministic torch kernels (for exact resume on GPU)")
    peak_tflops: float = opt(0.0, "peak TFLOP/s of one device at this run's --precision, for "
                             "the mfu field of the epoch lines (achieved TFLOP/s over peak x "
                             "devices); 0: look the GPU up in a table of common ones (on a "
                             "CPU: no mfu)")

    def check_device(self) -> None:
        require(self.peak_tflops >= 0, "--peak-tflops", self.peak_tflops,
                "use 0 (look the GPU up) or a device's peak, e.g. 989 for an H100 in bf16")
        require(self.threads >= 0, "--threads", self.threads,
                "use 0 (automatic) or a positive count")
        require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                "--device", self.device, "use auto, cpu, cuda or cuda:N")
