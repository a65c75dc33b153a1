"""Build-time converters from a checkpoint to runtime bundles (installed as `laya.export`).

They may import heavy build tools (torch, onnx, coremltools); the runtimes they feed must not.
"""
