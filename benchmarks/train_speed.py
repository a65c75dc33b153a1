"""Fine-tuning speed on the mmBERT-base shape (22 layers, d 768, 256k vocabulary): examples per second
for head-only (`--freeze-encoder`) and full fine-tuning, on the routing task's rows, this machine's CPU.

    .venv/bin/python benchmarks/train_speed.py [--examples 64] [--batch-size 8]

Times optimizer steps after one warm-up step, median of the steps; the checkpoint is generated
(random weights in the exact format), so only the speed means anything.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from laya.calibration.data import read_records
from laya.encoder.checkpoint import load_checkpoint
from laya.encoder.runtimes.pytorch import TorchRuntime
from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
from laya.testing.routing_task import routing_lines, write_jsonl
from laya.training.examples import examples_of
from laya.training.loop import Settings, Trainer

BASE = TestCheckpointSpec(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                          local_attention=128, max_len=1024, head_max_len=256, vocab_size=256000, seed=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "base", BASE)
        checkpoint = load_checkpoint(folder)
        examples = examples_of(read_records(write_jsonl(Path(tmp) / "d.jsonl", routing_lines(args.examples))))
        tokens = []
        for frozen in (True, False):
            net = TorchRuntime(checkpoint).net
            settings = Settings(batch_size=args.batch_size, freeze_encoder=frozen)
            trainer = Trainer(net, checkpoint, settings, steps_total=100)
            batches = [examples[i : i + args.batch_size] for i in range(0, len(examples), args.batch_size)]
            trainer.step(batches[0])  # warm-up
            times = []
            for batch in batches[1:]:
                started = time.perf_counter()
                trainer.step(batch)
                times.append(time.perf_counter() - started)
            per_step = statistics.median(times)
            tokens.append((frozen, args.batch_size / per_step, per_step))
            autocast = str(trainer.dtype).replace("torch.", "") if trainer.dtype else "fp32"
            del net, trainer
        print(f"mmBERT-base shape, {torch.get_num_threads()} threads, batch {args.batch_size}, {autocast}")
        for frozen, rate, per_step in tokens:
            print(f"{'head only' if frozen else 'full fine-tuning':18s} {rate:7.2f} examples/s "
                  f"({per_step * 1000:.0f} ms per step of {args.batch_size})")


if __name__ == "__main__":
    main()
