"""A network compiled ahead of time by TorchInductor, kept in the cache, loaded in a second or two.

Eager torch runs a layer as a few dozen separate kernels, each reading and writing the whole row
(norms, RoPE, casts, GeGLU's product, residual adds); TorchInductor fuses each chain between two matrix
products into one vectorised loop, and with the weights frozen into the program it packs them once
for oneDNN's matrix-unit kernels (AMX, AVX-512). Compiling takes about a minute on two cores, so it
happens once per checkpoint, plan, processor and torch version and the program is cached
(`$LAYA_CACHE/compiled/<key>.pt2`); later loads unpack it. One row at any length and any number of
options is one program (dynamic shapes): a server never compiles on a request's path.

Compiling needs a C++ compiler (the one TorchInductor finds: `$CXX`, else g++ or clang++); without
one the network runs eagerly, with the same maths.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from laya.encoder.cache import cache_root, locked

log = logging.getLogger("laya")
SUFFIX = ".pt2"


def programs_root() -> Path:
    return cache_root() / "compiled"


def target() -> str:
    """What a compiled program is specific to: the vector instructions TorchInductor compiles for on this
    processor and the torch version (a program compiled elsewhere may use instructions missing here)."""
    import hashlib

    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = str(pick_vec_isa()) or "scalar"
    return f"{hashlib.sha256(isa.encode()).hexdigest()[:8]}-torch{torch.__version__}"


def compiler_problem() -> str | None:
    """Why nothing can be compiled here (no C++ compiler on the PATH), or None."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    if any(shutil.which(name) for name in names):
        return None
    return (f"no C++ compiler found ({' or '.join(names)} on the PATH) for TorchInductor; install one "
            "(e.g. Debian's g++) to run compiled, or pass compiled=False")


class SingleRow(nn.Module):
    """What is compiled: one unpadded row (`keep=None`), its embeddings, markers and question type."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, emb: torch.Tensor, marker_pos: torch.Tensor, marker_mask: torch.Tensor,
                qtype: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(emb, None, marker_pos, marker_mask, qtype)


def example_length(half_window: int, max_len: int) -> int:
    """The row length the program is traced at. Shapes are dynamic, but the tracer still specialises on
    what the example makes look constant (a length under half a window made a blocked local attention
    bake its block count in, silently wrong at other lengths): a length past the window and no round
    number, within the row."""
    return max(2, min(max_len - 1, 3 * half_window + half_window // 2 + 1))


def compile_row_program(net: nn.Module, hidden_size: int, length: int, path: Path) -> None:
    """Export `net` over one row (any length, any number of options; traced at `length`, see
    `example_length`) and compile it into `path`."""
    import torch._inductor.config as inductor
    from torch.export import Dim, export

    example = (torch.zeros(1, length, hidden_size), torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.bool),
               torch.zeros(1, dtype=torch.int64))
    dynamic = ({1: Dim.DYNAMIC}, {1: Dim.DYNAMIC}, {1: Dim.DYNAMIC}, None)
    # freezing: the weights become constants, so the matrix products get oneDNN's packed weights;
    # dynamic threads: the kernels use the thread count set at run time (the runtime's `threads`)
    with torch.no_grad(), inductor.patch({"freezing": True, "cpp.dynamic_threads": True}):
        program = export(SingleRow(net).eval(), example, dynamic_shapes=dynamic)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))


def cached_program(key: str, build: Callable[[Path], None]) -> Path:
    """The program `key`, compiled by `build(path)` on first use into the cache (written whole or not
    at all: an interrupted compile never leaves a file that looks finished)."""
    path = programs_root() / f"{key}{SUFFIX}"
    if path.is_file():
        return path
    with locked(programs_root() / f".{key}.lock"):
        if path.is_file():
            return path
        log.info("compiling the network into %s (once for this checkpoint, processor and torch version; "
                 "about a minute on two cores)", path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=SUFFIX)
        os.close(fd)
        try:
            build(Path(tmp))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return path


def load_program(path: Path) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return torch._inductor.aoti_load_package(str(path))
