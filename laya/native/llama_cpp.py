"""llama.cpp's backends and buffers, for both engines that run it (the decide engine's chat models, the
encoder's `llama` runtime).

A llama.cpp built with runtime CPU dispatch (`GGML_BACKEND_DL`, `GGML_CPU_ALL_VARIANTS`: see
scripts/setup.sh) has no CPU kernels linked in: they are `libggml-cpu-<variant>.so` modules in
llama-cpp-python's `lib` folder, and `load_backends` has ggml load the one that scores best on this
processor before the first model is loaded (llama.cpp itself would only look next to the Python
executable and in the working directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from laya.errors import RuntimeUnavailable


def load_backends(llama_cpp) -> str | None:
    """Load llama.cpp's backends from llama-cpp-python's `lib` folder when none is loaded yet, so a
    runtime-dispatch build gets the CPU variant that scores best here. A no-op on a build with its
    CPU backend linked in (that one counts as loaded). Returns the CPU module loaded, if one is
    (`None` on a build with the CPU backend linked in, or off Linux)."""
    lib = llama_cpp.llama_cpp._lib  # libllama: the ggml symbols resolve through its dependencies
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_count.argtypes = []
    if lib.ggml_backend_reg_count() == 0:
        lib.ggml_backend_load_all_from_path.restype = None
        lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        # ggml reports each module it loads through llama-cpp-python's log, which prints to stderr
        # unless its logger's level says otherwise (as Llama(verbose=False) sets it afterwards)
        log = logging.getLogger("llama-cpp-python")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            lib.ggml_backend_load_all_from_path(os.fsencode(llama_cpp.llama_cpp._base_path))
        finally:
            log.setLevel(level)
        if lib.ggml_backend_reg_count() == 0:
            raise RuntimeUnavailable(f"llama.cpp found no backend it can run in {llama_cpp.llama_cpp._base_path} "
                                     "(no libggml-cpu-*.so supports this processor)")
    return loaded_cpu_module()


def extra_buffers_allowed() -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (AMX, repacked layouts).

    Not on a processor with AMX unless LAYA_LLAMA_AMX=1: ggml's AMX matmuls (used for quantised weights
    in its AMX buffers) died with an illegal instruction on an AMX Xeon here (`tileloadd` with no tile
    configuration loaded), in the decide engine (SmolLM2's Q4_1) and in the encoder (Q8_0), while AMX
    itself worked in a test program. Without the extra buffers such a machine runs the AVX-512 kernels,
    as every processor without AMX does."""
    if os.environ.get("LAYA_LLAMA_AMX") == "1":
        return True
    from laya.native.cpu import cpu

    return not ({"amx_int8", "amx_tile", "amx_bf16"} & cpu().flags)


@contextlib.contextmanager
def model_params_for_this_cpu(llama_cpp) -> Iterator[None]:
    """llama-cpp-python's `Llama` takes no `use_extra_bufts`: while it loads a model, its default model
    parameters say what `extra_buffers_allowed` says."""
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params
    if extra_buffers_allowed():
        yield
        return

    def defaults():
        params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = defaults
    try:
        yield
    finally:
        module.llama_model_default_params = original


def loaded_cpu_module() -> str | None:
    """The `libggml-cpu-<variant>` module mapped into this process (Linux), or `None`."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split()[-1] for line in maps if "/libggml-cpu-" in line}
    except OSError:
        return None
    return Path(sorted(found)[0]).name if found else None
