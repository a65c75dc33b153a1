"""Generators of small models in the exact published formats, for tests, benchmarks and `laya demo`:
laya checkpoints (`checkpoints`), chat GGUFs llama.cpp loads (`chat_gguf`), and a learnable routing
task for fine-tuning (`routing_task`). Shipped, so a user can reproduce any test or benchmark offline."""
