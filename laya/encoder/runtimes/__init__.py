"""Runtimes: one adapter per framework behind the `Runtime` interface, created by name."""

from laya.encoder.runtimes.base import RUNTIMES, Runtime, available_runtimes, create_runtime

__all__ = ["RUNTIMES", "Runtime", "available_runtimes", "create_runtime"]
