"""Throughput that compares across hardware: the model's FLOPs per sample, counted once at
start-up, turn each epoch's samples per second into TFLOP/s (the ``tflops`` field of the epoch
line), and into MFU (``mfu``: the share of the devices' peak) where the peak is known.

The count is torch.utils.flop_counter's: a forward and a backward pass on the first samples of
the training split, on a copy of the model in eval mode, so the run's parameters, gradients, its
random stream and the update scheme's gradient hooks (Horovod's allreduce) see nothing, and no
layer starts a collective (SyncBatchNorm) on the main process alone. It counts matrix products and
convolutions (2 FLOPs per multiply-add), the work a peak figure describes; elementwise work is
left out, as in the usual MFU. A model it cannot count (a custom op, a device the copy does not
fit on) gives no figure and one line saying so; training goes on.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from ..data.batches import to_device
from ..replica import batch_length, call_model

# Dense peak TFLOP/s per device (no structured sparsity), from NVIDIA's datasheets: A100 (SXM
# and PCIe 80GB), H100 (SXM5, PCIe, NVL), H200 (SXM, NVL), V100 (SXM2), T4, L4, L40S, A10.
# "fp32" is the CUDA cores' rate: torch does not use TF32 for float32 matrix products unless
# torch.backends.cuda.matmul.allow_tf32 is set. NVIDIA publishes no A10G datasheet (it is
# AWS's variant of the A10, same chip, lower clocks): the A10's figures, an upper bound.
# Matched in order against torch.cuda.get_device_name(): longer names first.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "32": 51.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "32": 60.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "32": 67.0}),
    ("H200 NVL", {"bf16": 835.0, "fp16": 835.0, "32": 60.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "32": 19.5}),
    ("A10G", {"bf16": 125.0, "fp16": 125.0, "32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "32": 31.2}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "32": 30.3}),
    ("V100", {"fp16": 125.0, "32": 15.7}),  # no bfloat16 units: bf16 runs at no listed rate
    ("T4", {"fp16": 65.0, "32": 8.1}),
]


def peak_for(device_name: str, precision: str) -> float | None:
    """The table's dense peak for a device name and --precision (32, bf16, fp16), or None."""
    for name, peaks in PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return peaks.get(precision)
    return None


def device_peak(peak_tflops: float, device: torch.device, precision: str) -> float | None:
    """--peak-tflops when given, else the table's figure for this CUDA device; None on a CPU."""
    if peak_tflops:
        return peak_tflops
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_for(torch.cuda.get_device_name(device), precision)


def count_flops(model: torch.nn.Module, loss_fn, x: Any, y: Any) -> int:
    """FLOPs of one forward and backward pass of ``model`` on the batch (x, y), with y moved
    to the output's device."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        output = call_model(model, x)
        if isinstance(output, torch.Tensor):
            y = to_device(y, output.device)
        loss_fn(output, y).backward()
    return counter.get_total_flops()


def flops_per_sample(replica, sample: tuple[Any, Any]) -> tuple[float | None, str]:
    """(FLOPs per training sample, forward and backward; None if not countable, why)."""
    x, y = sample
    gpus = [d for d in replica.devices if d.type == "cuda"]
    try:
        # fork_rng: a dropout layer's draws must not shift the run's random stream
        with torch.random.fork_rng(devices=gpus):
            model = copy.deepcopy(replica.model)  # the run's gradients and hooks stay untouched
            # eval mode: layers that talk across workers in training (--sync-batchnorm) would
            # start a collective on this process alone; products and convolutions are the same
            model.eval()
            flops = count_flops(model, replica.objective.loss, to_device(x, replica.device), y)
    except Exception as e:  # noqa: BLE001 - a count must never stop training
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if flops <= 0:
        return None, "the flop counter found no matrix products or convolutions"
    return flops / batch_length(y), ""


# Set (to anything but "") to skip the count. It costs each process a second or two of CPU at
# start-up (the flop counter loads torch._dynamo on first use): nothing for a training job, but
# minutes for the test suite's hundreds of short jobs (tests/launch.py sets it; the tests of the
# figures clear it).
NO_COUNT = "HVDTRAIN_NO_FLOP_COUNT"


def throughput_header(cfg, workload, replica, num_workers: int,
                      announce: bool = True) -> dict[str, Any]:
    """The run header's fields for the throughput figures (run_log.run_header); with
    ``announce``, prints the count, or why there is none."""
    if os.environ.get(NO_COUNT):
        per_sample, why = None, f"{NO_COUNT} is set"
    else:
        per_sample, why = flops_per_sample(replica, workload.train.sample())
    # distinct devices: pipeline stages that share one (cpu,cpu) halved the MFU
    devices = num_workers * len(set(replica.devices))
    peak = device_peak(cfg.run.peak_tflops, replica.device, cfg.run.precision)
    if announce:
        print(count_line(per_sample, why, peak, devices), flush=True)
    return {"flops_per_sample": per_sample, "peak_tflops": peak, "devices": devices}


def count_line(per_sample: float | None, why: str, peak: float | None, devices: int) -> str:
    """What the main process prints of the count."""
    if per_sample is None:
        return f"hvdtrain: FLOPs per sample unknown ({why}); the epoch lines show no tflops"
    where = (f"; MFU against {peak:g} TFLOP/s per device x {devices}" if peak
             else "; no MFU: the device's peak is not known (pass --peak-tflops)")
    return (f"hvdtrain: {per_sample / 1e9:.4g} GFLOP per sample (forward and backward, "
            f"torch.utils.flop_counter){where}")


def epoch_throughput(header: dict[str, Any], samples_per_sec: float) -> dict[str, float]:
    """The epoch line's tflops (achieved, all workers together) and mfu (tflops over the
    peak of every device); empty when the FLOPs are unknown, no mfu when the peak is."""
    per_sample = header.get("flops_per_sample")
    if not per_sample:
        return {}
    tflops = per_sample * samples_per_sec / 1e12
    out = {"tflops": float(f"{tflops:.4g}")}
    if header.get("peak_tflops"):
        out["mfu"] = float(f"{tflops / (header['peak_tflops'] * header['devices']):.4g}")
    return out
