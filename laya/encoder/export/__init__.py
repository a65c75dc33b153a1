"""Build-time converters from a checkpoint to runtime bundles.

They may import heavy build tools (torch, onnx, coremltools); the runtimes they feed must not.
"""
