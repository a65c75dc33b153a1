"""Fine-tuning laya checkpoints on labelled decisions (`laya train`, `laya.train`). Needs the [train] extra."""
