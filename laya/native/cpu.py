"""What this machine's processor can do, as far as choosing a runtime and a precision depends on it.

bf16 pays only on processors with bf16 arithmetic units (x86 AVX512-BF16 or AMX, ARM's BF16
extension, Apple M2 and later): elsewhere bf16 matmuls are emulated and run many times slower than
fp32 (measured: 1.2 GFLOP/s against 108 on an AVX2-only Zen CPU).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
import sys
from dataclasses import dataclass

X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# int8 dot products: AMX-INT8 tiles, AVX-512 VNNI or AVX-VNNI (ARM: the dot-product and i8mm extensions)
X86_INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")
ARM_INT8_FLAGS = ("i8mm", "asimddp")
# What decides which runtime and precision is fast here: wide vectors, bf16 units (bf16), dot-product
# int8 units (int8 matmuls of ONNX Runtime), fp16 arithmetic.
X86_RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni", "avx_vnni",
                      "avx512_fp16")
ARM_RELEVANT_FLAGS = ("asimddp", "i8mm", "bf16", "feat_bf16", "sve", "fphp")


@dataclass(frozen=True)
class Cpu:
    model: str
    arch: str
    flags: frozenset[str]
    apple_silicon: bool = False
    # x86's CPUID family and model ("family 23 model 49"): a virtual machine may name only "AMD EPYC",
    # and two generations behind that name (Zen 2, Zen 3) time the same runtimes differently
    generation: str = ""

    @property
    def bf16_units(self) -> str | None:
        """The unit that makes bf16 fast here (e.g. 'avx512_bf16'), or None."""
        if self.arch in ("x86_64", "amd64"):
            return next((f for f in X86_BF16_FLAGS if f in self.flags), None)
        if "bf16" in self.flags or "feat_bf16" in self.flags:
            return "bf16"
        return None

    @property
    def int8_units(self) -> str | None:
        """The unit that makes int8 products fast here (e.g. 'amx_int8'), or None."""
        flags = X86_INT8_FLAGS if self.arch in ("x86_64", "amd64") else ARM_INT8_FLAGS
        return next((f for f in flags if f in self.flags), None)

    def int8_refusal(self) -> str | None:
        """Why int8 products would be wrong or slow here, or None when the processor has int8 dot-product
        units. Without them (AVX2 alone) oneDNN adds each pair of int8 products in 16 bits, which saturate
        on full-range values: the two-level int8 network answered 0.07 from fp32 on an AVX2 EPYC."""
        if self.int8_units:
            return None
        wanted = " or ".join(X86_INT8_FLAGS if self.arch in ("x86_64", "amd64") else ARM_INT8_FLAGS)
        return (f"this CPU ({self.model}, {self.arch}) has no int8 dot-product units ({wanted}): int8 products "
                "would saturate or be emulated")

    def bf16_refusal(self) -> str | None:
        """Why bf16 would be slower here, or None when the processor has bf16 units."""
        if self.bf16_units:
            return None
        wanted = " or ".join(X86_BF16_FLAGS) if self.arch in ("x86_64", "amd64") else "the BF16 extension"
        return (f"this CPU ({self.model}, {self.arch}) has no bf16 arithmetic units ({wanted}): bf16 would be "
                "emulated and run many times slower than fp32")

    def describe(self) -> str:
        """One line naming the processor and which of the flags that matter for speed it has, so that a
        benchmark's figures can be read against the hardware that produced them."""
        x86 = self.arch in ("x86_64", "amd64")
        relevant = X86_RELEVANT_FLAGS if x86 else ARM_RELEVANT_FLAGS
        have = [f for f in relevant if f in self.flags]
        lacks = [f for f in relevant if f not in self.flags]
        parts = (self.generation, "Apple silicon" if self.apple_silicon else "")
        detail = "".join(f", {part}" for part in parts if part)
        text = f"{self.model} ({self.arch}{detail})"
        text += f": {' '.join(have) if have else 'none of ' + ', '.join(relevant)}"
        if have and lacks:
            text += f"; without {' '.join(lacks)}"
        return text + f"; bf16 units: {self.bf16_units or 'none'}"

    @property
    def key(self) -> str:
        """Stable identity of the processor for cached measurements (gates, benchmark picks)."""
        parts = [self.model, self.arch, ",".join(sorted(self.flags))] + ([self.generation] if self.generation else [])
        text = "|".join(parts)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


# /proc/cpuinfo's lines, by what they tell (x86 names, then ARM's and others')
CPUINFO_FIELDS = {"model name": "name", "cpu model": "name", "hardware": "name", "flags": "flags",
                  "features": "flags", "cpu family": "family", "model": "model"}


def _linux() -> tuple[str, set[str], str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return parse_cpuinfo(fh.read())
    except OSError:
        return "", set(), ""


def parse_cpuinfo(text: str) -> tuple[str, set[str], str]:
    """The first processor's model name, flags and (x86) family and model from /proc/cpuinfo's text."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        key = CPUINFO_FIELDS.get(name.strip().lower())
        if key and key not in found:
            found[key] = value.strip()
    family, number = found.get("family", ""), found.get("model", "")
    generation = f"family {family} model {number}" if family.isdigit() and number.isdigit() else ""
    return found.get("name", ""), set(found.get("flags", "").split()), generation


def _darwin() -> tuple[str, set[str], str]:
    def sysctl(name: str) -> str:
        try:
            return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    flags = {"feat_bf16"} if sysctl("hw.optional.arm.FEAT_BF16") == "1" else set()
    return sysctl("machdep.cpu.brand_string"), flags, ""


@functools.lru_cache(maxsize=1)
def cpu() -> Cpu:
    arch = platform.machine().lower()
    model, flags, generation = _darwin() if sys.platform == "darwin" else _linux()
    return Cpu(model=model or platform.processor() or arch, arch=arch, flags=frozenset(f.lower() for f in flags),
               apple_silicon=sys.platform == "darwin" and arch == "arm64", generation=generation)
