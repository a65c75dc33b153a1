"""A small numpy evaluator of Core ML ML Programs, reading a saved `.mlpackage`.

Core ML predicts only on Apple platforms. To prove on any machine that a converted bundle computes
what the reference computes, this module executes the saved MIL program itself: it reads the
protobuf spec (`Data/com.apple.CoreML/model.mlmodel`) and the weight blobs (`weights/weight.bin`),
and runs the main function's operations in order with numpy.

Numerics: every operation computes in float32 (float64 for nothing) and rounds its result to the
dtype the program declares for that output, so an fp16 program is rounded to fp16 after every op,
as Core ML's fp16 compute does; reductions and matmuls accumulate in fp32. It covers the operations
laya's bundles use; any other operation fails by name (`UnknownOperation`) rather than guessing.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya.errors import LayaError

SPEC = Path("Data/com.apple.CoreML/model.mlmodel")
WEIGHTS_PREFIX = "@model_path/"
BLOB_SENTINEL = 0xDEADBEEF


class UnknownOperation(LayaError):
    """The program uses an operation this evaluator does not implement."""


def _proto():
    try:
        from coremltools.proto import MIL_pb2, Model_pb2
    except ImportError as exc:
        raise LayaError("reading a Core ML program needs coremltools (pip install 'laya-runtime[coreml]')") from exc
    return MIL_pb2, Model_pb2


_DTYPES = {"FLOAT16": np.float16, "FLOAT32": np.float32, "FLOAT64": np.float64, "INT8": np.int8,
           "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16,
           "UINT32": np.uint32, "BOOL": np.bool_}


def _dtype(MIL_pb2, code: int):
    name = MIL_pb2.DataType.Name(code)
    if name == "STRING":
        return str
    if name not in _DTYPES:
        raise UnknownOperation(f"data type {name} is not supported by the MIL evaluator")
    return _DTYPES[name]


class Program:
    """The main function of a saved ML Program, ready to run."""

    def __init__(self, package: str | Path):
        MIL_pb2, Model_pb2 = _proto()
        self.MIL_pb2 = MIL_pb2
        self.package = Path(package)
        spec = Model_pb2.Model()
        spec.ParseFromString((self.package / SPEC).read_bytes())
        if spec.WhichOneof("Type") != "mlProgram":
            raise LayaError(f"{package}: not an ML Program")
        self.spec = spec
        function = spec.mlProgram.functions["main"]
        self.function = function
        self.block = function.block_specializations[function.opset]
        self.opset = function.opset
        self.inputs = {i.name: i for i in function.inputs}
        self.outputs = list(self.block.outputs)
        self._blobs: dict[str, bytes] = {}
        self._consts: dict[str, Any] = {}

    @property
    def operation_types(self) -> set[str]:
        return {op.type for op in self.block.operations}

    # values
    def _blob(self, file_name: str, offset: int, dtype, shape: tuple[int, ...]) -> np.ndarray:
        if file_name not in self._blobs:
            rel = file_name[len(WEIGHTS_PREFIX):] if file_name.startswith(WEIGHTS_PREFIX) else file_name
            self._blobs[file_name] = (self.package / "Data/com.apple.CoreML" / rel).read_bytes()
        data = self._blobs[file_name]
        sentinel, _, size, start = struct.unpack_from("<IIQQ", data, offset)
        if sentinel != BLOB_SENTINEL:
            raise LayaError(f"{self.package}: weight blob at offset {offset} has no valid header")
        array = np.frombuffer(data, dtype=dtype, count=size // np.dtype(dtype).itemsize, offset=start)
        return array.reshape(shape)

    def _value(self, value) -> Any:
        kind = value.WhichOneof("value")
        vtype = value.type
        if vtype.WhichOneof("type") != "tensorType":
            raise UnknownOperation(f"value of type {vtype.WhichOneof('type')} is not supported")
        tensor_type = vtype.tensorType
        dtype = _dtype(self.MIL_pb2, tensor_type.dataType)
        shape = tuple(d.constant.size for d in tensor_type.dimensions)
        if kind == "blobFileValue":
            return self._blob(value.blobFileValue.fileName, value.blobFileValue.offset, dtype, shape)
        tensor = value.immediateValue.tensor
        field = tensor.WhichOneof("value")
        if field == "strings":
            values = list(tensor.strings.values)
            return values[0] if not shape else np.array(values, dtype=object).reshape(shape)
        if field == "bytes":
            array = np.frombuffer(tensor.bytes.values, dtype=dtype)
        else:
            array = np.array(list(getattr(tensor, field).values), dtype=dtype)
        return array.reshape(shape) if shape else array.reshape(())

    def _argument(self, env: dict[str, Any], arg) -> Any:
        values = []
        for binding in arg.arguments:
            if binding.WhichOneof("binding") == "name":
                values.append(env[binding.name])
            else:
                values.append(self._value(binding.value))
        return values

    # running
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env: dict[str, Any] = {}
        for name, spec in self.inputs.items():
            if name not in feeds:
                raise LayaError(f"missing input {name!r}")
            dtype = _dtype(self.MIL_pb2, spec.type.tensorType.dataType)
            env[name] = np.asarray(feeds[name]).astype(dtype)
        for op in self.block.operations:
            if op.type == "const":
                key = op.outputs[0].name
                if key not in self._consts:
                    self._consts[key] = self._value(op.attributes["val"])
                env[key] = self._consts[key]
                continue
            impl = OPS.get(op.type)
            if impl is None:
                raise UnknownOperation(f"the MIL evaluator does not implement operation {op.type!r} "
                                       f"(in {self.package.name})")
            args = {k: self._argument(env, v) for k, v in op.inputs.items()}
            results = impl(args)
            results = results if isinstance(results, tuple) else (results,)
            for out, result in zip(op.outputs, results):
                dtype = _dtype(self.MIL_pb2, out.type.tensorType.dataType)
                env[out.name] = np.asarray(result).astype(dtype) if dtype is not str else result
        return {name: env[name] for name in self.outputs}


# operations: each takes {input name: [values]} and returns the output(s), computed in fp32
def _one(args: dict[str, list], name: str, default: Any = None) -> Any:
    values = args.get(name)
    return values[0] if values else default


def _f(args, name: str) -> np.ndarray:
    return np.asarray(_one(args, name), dtype=np.float32)


def _ints(args, name: str, default=None):
    value = _one(args, name, default)
    return None if value is None else [int(v) for v in np.atleast_1d(value)]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def op(args):
        x, y = _one(args, "x"), _one(args, "y")
        if np.asarray(x).dtype.kind in "iub" and np.asarray(y).dtype.kind in "iub":
            return fn(np.asarray(x), np.asarray(y))
        return fn(np.asarray(x, np.float32), np.asarray(y, np.float32))
    return op


def _layer_norm(args):
    x = _f(args, "x")
    axes = tuple(_ints(args, "axes"))
    eps = float(_one(args, "epsilon", 1e-5))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if _one(args, "gamma") is not None:
        y = y * _f(args, "gamma")
    if _one(args, "beta") is not None:
        y = y + _f(args, "beta")
    return y


def _batch_norm(args):
    """Inference batch norm over axis 1 (channels)."""
    x = _f(args, "x")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = _f(args, "mean").reshape(shape), _f(args, "variance").reshape(shape)
    y = (x - mean) / np.sqrt(var + float(_one(args, "epsilon", 1e-5)))
    if _one(args, "gamma") is not None:
        y = y * _f(args, "gamma").reshape(shape)
    if _one(args, "beta") is not None:
        y = y + _f(args, "beta").reshape(shape)
    return y


def _conv(args):
    """1x1 convolutions only (every Linear of the Neural Engine layout); anything else is refused."""
    x, w = _f(args, "x"), _f(args, "weight")
    groups = int(_one(args, "groups", 1))
    strides, dilations = _ints(args, "strides", [1, 1]), _ints(args, "dilations", [1, 1])
    pads = _ints(args, "pad", [0, 0, 0, 0])
    if w.ndim != 4 or w.shape[2:] != (1, 1) or groups != 1 or set(strides) != {1} or set(dilations) != {1} \
            or any(pads):
        raise UnknownOperation(f"conv with weight {w.shape}, groups {groups}, strides {strides}, pads {pads}: "
                               "the MIL evaluator implements 1x1 convolutions only")
    y = np.einsum("oc,bchw->bohw", w[:, :, 0, 0], x)
    bias = _one(args, "bias")
    return y if bias is None else y + np.asarray(bias, np.float32).reshape(1, -1, 1, 1)


def _matmul(args):
    x, y = _f(args, "x"), _f(args, "y")
    if bool(_one(args, "transpose_x", False)):
        x = np.swapaxes(x, -1, -2)
    if bool(_one(args, "transpose_y", False)):
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def _linear(args):
    y = _f(args, "x") @ _f(args, "weight").T
    bias = _one(args, "bias")
    return y if bias is None else y + np.asarray(bias, np.float32)


def _softmax(args):
    x = _f(args, "x")
    axis = int(_one(args, "axis", -1))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; exact GELU needs it


def _gelu(args):
    x = _f(args, "x")
    mode = _one(args, "mode", "EXACT")
    if mode == "EXACT":
        return (0.5 * x * (1.0 + erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(np.float32)
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise UnknownOperation(f"gelu mode {mode!r} is not implemented by the MIL evaluator")


def _split(args):
    x = np.asarray(_one(args, "x"))
    axis = int(_one(args, "axis"))
    sizes = _ints(args, "split_sizes")
    if sizes is None:
        n = int(_one(args, "num_splits"))
        sizes = [x.shape[axis] // n] * n
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _slice_by_index(args):
    x = np.asarray(_one(args, "x"))
    rank = x.ndim
    begin, end = _ints(args, "begin"), _ints(args, "end")
    stride = _ints(args, "stride", [1] * rank)
    begin_mask = [bool(v) for v in np.atleast_1d(_one(args, "begin_mask", [False] * rank))]
    end_mask = [bool(v) for v in np.atleast_1d(_one(args, "end_mask", [False] * rank))]
    squeeze = [bool(v) for v in np.atleast_1d(_one(args, "squeeze_mask", [False] * rank))]
    index = []
    for i in range(rank):
        b = None if begin_mask[i] else begin[i]
        e = None if end_mask[i] else end[i]
        if squeeze[i]:
            index.append(begin[i])
        else:
            index.append(slice(b, e, stride[i]))
    return x[tuple(index)]


def _reshape(args):
    return np.reshape(np.asarray(_one(args, "x")), _ints(args, "shape"))


def _concat(args):
    values = args["values"]
    return np.concatenate([np.atleast_1d(np.asarray(v)) for v in values], axis=int(_one(args, "axis")))


def _transpose(args):
    return np.transpose(np.asarray(_one(args, "x")), _ints(args, "perm"))


def _cast(args):
    target = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_, "int16": np.int16,
              "uint16": np.uint16, "int8": np.int8, "uint8": np.uint8}[_one(args, "dtype")]
    return np.asarray(_one(args, "x")).astype(target)


def _gather(args):
    x, indices = np.asarray(_one(args, "x")), np.asarray(_one(args, "indices")).astype(np.int64)
    axis = int(_one(args, "axis", 0))
    if int(_one(args, "batch_dims", 0)):
        raise UnknownOperation("gather with batch_dims is not implemented by the MIL evaluator")
    return np.take(x, indices, axis=axis)


def _gather_along_axis(args):
    x, indices = np.asarray(_one(args, "x")), np.asarray(_one(args, "indices")).astype(np.int64)
    return np.take_along_axis(x, indices, axis=int(_one(args, "axis", 0)))


def _reduce(fn):
    def op(args):
        x = _f(args, "x")
        axes = _ints(args, "axes")
        keep = bool(_one(args, "keep_dims", False))
        return fn(x, axis=None if axes is None else tuple(axes), keepdims=keep)
    return op


def _select(args):
    return np.where(np.asarray(_one(args, "cond")).astype(bool), _one(args, "a"), _one(args, "b"))


def _expand_dims(args):
    x = np.asarray(_one(args, "x"))
    for axis in sorted(_ints(args, "axes")):
        x = np.expand_dims(x, axis)
    return x


def _squeeze(args):
    x = np.asarray(_one(args, "x"))
    axes = _ints(args, "axes")
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))


def _topk(args):
    x = _f(args, "x")
    k, axis = int(_one(args, "k", 1)), int(_one(args, "axis", -1))
    ascending = bool(_one(args, "ascending", False))
    order = np.argsort(x if ascending else -x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)


def _range_1d(args):
    return np.arange(_one(args, "start"), _one(args, "end"), _one(args, "step"))


def _tile(args):
    return np.tile(np.asarray(_one(args, "x")), _ints(args, "reps"))


def _shape(args):
    return np.array(np.asarray(_one(args, "x")).shape, dtype=np.int32)


def _fill_like(args):
    return np.full(np.asarray(_one(args, "ref_tensor")).shape, _one(args, "value", 0.0))


def _stack(args):
    return np.stack([np.asarray(v) for v in args["values"]], axis=int(_one(args, "axis")))


# Exactly the operations laya's Core ML bundles contain (general and Neural Engine, fp16 and fp32).
OPS: dict[str, Callable[[dict[str, list]], Any]] = {
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul": _binary(np.multiply),
    "real_div": _binary(np.divide), "maximum": _binary(np.maximum), "equal": _binary(np.equal),
    "less": _binary(np.less), "greater": _binary(np.greater), "greater_equal": _binary(np.greater_equal),
    "abs": lambda a: np.abs(_one(a, "x")), "log": lambda a: np.log(_f(a, "x") + float(_one(a, "epsilon", 0.0))),
    "relu": lambda a: np.maximum(_f(a, "x"), 0.0),
    "layer_norm": _layer_norm, "batch_norm": _batch_norm, "conv": _conv, "matmul": _matmul, "linear": _linear,
    "softmax": _softmax, "gelu": _gelu, "split": _split, "slice_by_index": _slice_by_index, "reshape": _reshape,
    "concat": _concat, "stack": _stack, "transpose": _transpose, "cast": _cast, "gather": _gather,
    "gather_along_axis": _gather_along_axis, "select": _select, "expand_dims": _expand_dims,
    "squeeze": _squeeze, "topk": _topk, "range_1d": _range_1d, "tile": _tile, "shape": _shape,
    "fill_like": _fill_like, "reduce_sum": _reduce(np.sum),
}
