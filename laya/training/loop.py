"""The fine-tuning loop (PyTorch): soft cross-entropy over each row's options, AdamW with a cosine
schedule, fp32 on the CPU (bf16 only when asked), mixed precision on GPUs, a checkpoint per epoch that
`--resume` continues.

The network is the reference runtime's (`laya.encoder.runtimes.pytorch.DecisionNet`), so what is trained is
exactly what every runtime then serves.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from laya.encoder.checkpoint import Checkpoint
from laya.errors import LayaError
from laya.training.examples import Example, batch_of, shuffled

STATE_FILE = "trainer_state.pt"


@dataclass
class Settings:
    epochs: int = 4
    batch_size: int = 16
    encoder_lr: float = 2.5e-5  # upstream's defaults
    head_lr: float = 1e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.01
    warmup: float = 0.06  # share of the steps with a linear warm-up before the cosine decay
    freeze_encoder: bool = False
    augment: bool = True  # shuffle choice options every epoch
    holdout: float = 0.2
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # auto (fp32 on the CPU, mixed on a GPU) | fp32 | bf16 | fp16; see pick_precision
    threads: int | None = None

    def check(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise LayaError("epochs and batch size must be at least 1")
        if not 0.0 < self.holdout < 1.0:
            raise LayaError(f"the held-out share must be between 0 and 1, got {self.holdout}")
        if min(self.encoder_lr, self.head_lr) <= 0 or self.min_lr < 0:
            raise LayaError("learning rates must be positive")
        if not 0.0 <= self.warmup < 1.0:
            raise LayaError(f"warmup is a share of the steps in [0, 1), got {self.warmup}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise LayaError(f"precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")


@dataclass
class History:
    epochs_done: int = 0
    steps: int = 0
    losses: list[float] = field(default_factory=list)  # per step
    epoch_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    examples_seen: int = 0


def pick_device(name: str) -> torch.device:
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise LayaError(f"unknown device {name!r}: {exc}") from exc
        if device.type == "cuda" and not torch.cuda.is_available():
            raise LayaError("device 'cuda' asked for, but torch sees no CUDA device")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise LayaError("device 'mps' asked for, but this is not an Apple GPU with MPS")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_precision(device: torch.device, asked: str) -> torch.dtype | None:
    """The autocast dtype (None: fp32).

    `auto` is fp32 on every CPU, whatever its bf16 units (AVX512-BF16, AMX, ARM BF16): what a CPU
    training run gives, and so every figure of its report, must not depend on which processor ran it,
    and bf16 rounds the encoder's activations enough to change the trained weights and the act head's
    inputs. bf16 on a CPU is a setting (`precision="bf16"`), taken as asked. On a GPU `auto` keeps
    mixed precision (bf16 where CUDA has it, else fp16; fp16 on MPS), which is what GPUs train in.
    """
    if asked == "fp32":
        return None
    if asked == "bf16":
        return torch.bfloat16
    if asked == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return None


class Trainer:
    def __init__(self, net: torch.nn.Module, checkpoint: Checkpoint, settings: Settings, steps_total: int):
        self.net, self.checkpoint, self.settings = net, checkpoint, settings
        self.device = pick_device(settings.device)
        self.dtype = pick_precision(self.device, settings.precision)
        net.to(self.device)
        if settings.freeze_encoder:
            for p in net.encoder.parameters():
                p.requires_grad_(False)
        head = [p for n, p in net.named_parameters() if not n.startswith("encoder.") and p.requires_grad]
        groups = [{"params": head, "lr": settings.head_lr}]
        if not settings.freeze_encoder:
            groups.append({"params": [p for p in net.encoder.parameters()], "lr": settings.encoder_lr})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=settings.weight_decay)
        warm = int(settings.warmup * steps_total)
        peaks = [g["lr"] for g in groups]

        def factor(step: int, peak: float) -> float:  # linear warm-up, then cosine from the peak to min_lr
            if step < warm:
                return (step + 1) / warm
            progress = (step - warm) / max(1, steps_total - warm)
            floor = min(1.0, settings.min_lr / peak)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [partial(factor, peak=peak) for peak in peaks])
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.history = History()

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self, examples: Sequence[Example]) -> float:
        batch, targets = batch_of(self.checkpoint, examples)
        tensors = [torch.from_numpy(getattr(batch, n)).to(self.device)
                   for n in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")]
        self.net.train()
        with self.autocast():
            h = self.net.encoder(input_ids=tensors[0], attention_mask=tensors[1]).last_hidden_state
        logits, _ = self.net.read(h.float(), *tensors[1:])
        target = torch.from_numpy(targets).to(logits.device)
        loss = -(target * torch.log_softmax(logits.to(target.device), -1)).sum(-1).mean()
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise LayaError(f"the loss became {value} at step {self.history.steps + 1}: lower the learning rates")
        self.history.steps += 1
        self.history.losses.append(value)
        self.history.examples_seen += len(examples)
        return value

    def epoch(self, examples: Sequence[Example], on_step: Callable[[int, int, float], None] | None = None) -> float:
        """One pass in a seeded order (epoch-dependent), options reshuffled where augmentation is on."""
        rng = random.Random(f"{self.settings.seed}-{self.history.epochs_done}")
        order = list(examples)
        rng.shuffle(order)
        if self.settings.augment:
            order = [shuffled(ex, rng) for ex in order]
        size = self.settings.batch_size
        started, losses = time.perf_counter(), []
        n_batches = -(-len(order) // size)
        for b in range(n_batches):
            losses.append(self.step(order[b * size : (b + 1) * size]))
            if on_step:
                on_step(b + 1, n_batches, losses[-1])
        self.history.seconds += time.perf_counter() - started
        self.history.epochs_done += 1
        mean = float(np.mean(losses))
        self.history.epoch_losses.append(mean)
        return mean

    # resume
    def save_state(self, folder: Path, extra: dict[str, Any]) -> None:
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict(), "history": asdict(self.history), **extra},
                   folder / STATE_FILE)

    def load_state(self, folder: Path) -> dict[str, Any]:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.history = History(**state["history"])
        return state
