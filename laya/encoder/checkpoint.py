"""Finding, verifying and strictly loading a laya checkpoint.

A checkpoint is a folder (local, or a Hub snapshot) with `rl_agent_config.json`,
`model.safetensors`, `encoder/config.json` and `tokenizer/`. Loading is all-or-nothing: every
file, name and shape is checked before any runtime sees the weights, and a mismatch raises a
`CheckpointError` naming the file and the tensor.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from laya.digests import sha256_of
from laya.encoder.config import AgentConfig, EncoderConfig, read_json
from laya.encoder.head_layout import checkpoint_tensors
from laya.encoder.tokenizer import Tokenizer
from laya.errors import CheckpointError

CONFIG_FILE = "rl_agent_config.json"
WEIGHTS_FILE = "model.safetensors"
ENCODER_CONFIG = "encoder/config.json"
TOKENIZER_DIR = "tokenizer"
HUB_PATTERNS = (CONFIG_FILE, WEIGHTS_FILE, "tokenizer/*", "encoder/*")


def verify_digests(folder: Path, expected: Mapping[str, str], *, evict: bool = False) -> None:
    """Refuse the folder unless each named file has the expected sha256 (checked before parsing).

    `evict` (a Hub snapshot): a file that does not match is removed from the cache, blob included, so
    no later load can take it as good; the next load downloads it again."""
    for rel, want in expected.items():
        path = folder / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: file not found (a sha256 was given for it)")
        got = sha256_of(path)
        if got.lower() != want.lower():
            note = ""
            if evict:
                evict_cached_file(path)
                note = "; the file was removed from the Hugging Face cache, so the next load downloads it again"
            raise CheckpointError(f"{path}: sha256 {got} does not match the expected {want.lower()}{note}")


def evict_cached_file(path: Path) -> None:
    """Remove a snapshot file of the Hugging Face cache and the blob its link points to."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)


def _is_commit(revision: str | None) -> bool:
    return revision is not None and len(revision) == 40 and all(c in "0123456789abcdef" for c in revision.lower())


def download(
    repo: str, *, revision: str | None = None, subfolder: str | None = None, local_only: bool = False,
    label: str | None = None,
) -> Path:
    """A Hub snapshot with only the checkpoint's four file patterns, into the standard Hugging Face
    cache with huggingface_hub's progress bars (cache, `HF_ENDPOINT` and `HF_HUB_OFFLINE` honoured).

    A commit-pinned revision already in the cache is used without touching the network: it cannot
    change. `local_only` never goes online. `label` names the model in errors (a registered name)."""
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a core dependency
        raise CheckpointError("huggingface_hub is needed to load a checkpoint from the Hub") from exc
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    kwargs: dict[str, Any] = dict(revision=revision, allow_patterns=[prefix + p for p in HUB_PATTERNS],
                  token=os.environ.get("HF_TOKEN") or None)
    where = f"{repo}{'@' + revision if revision else ''}{' (' + prefix.rstrip('/') + ')' if prefix else ''}"
    if label and label != repo:
        where = f"{label} ({where})"
    snapshot = None
    try:
        if local_only or _is_commit(revision):
            try:
                snapshot = snapshot_download(repo, local_files_only=True, **kwargs)
            except LocalEntryNotFoundError:
                if local_only:
                    raise
        if snapshot is None:
            snapshot = _cached_if_unreachable(repo, kwargs, constants.ENDPOINT) or snapshot_download(repo, **kwargs)
    except LocalEntryNotFoundError as exc:
        if local_only:
            raise CheckpointError(f"{where}: not in the local Hugging Face cache (local_only=True)") from exc
        offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
        reason = "offline mode is on (HF_HUB_OFFLINE)" if offline else \
            f"the Hub at {constants.ENDPOINT} cannot be reached"
        raise CheckpointError(
            f"{where}: not in the local Hugging Face cache and {reason}. Connect this machine to the Hub (or set "
            "HF_ENDPOINT to a mirror it can reach) and load it once to cache it, or copy the checkpoint folder "
            "here and load it by path") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(f"{where}: cannot download from the Hub ({_short(exc)})") from exc
    folder = Path(snapshot) / prefix if prefix else Path(snapshot)
    if not folder.is_dir():
        raise CheckpointError(f"{repo}: subfolder {subfolder!r} is not in the repository")
    return folder


def _cached_if_unreachable(repo: str, kwargs: dict[str, Any], endpoint: str) -> str | None:
    """The cached snapshot at once when the Hub's host refuses connections or has no address (raising
    LocalEntryNotFoundError without one): huggingface_hub retries such a request with backoff for about
    24 s before it gives up, and nothing answers on a refused port. A host that is slow or drops packets
    is left to huggingface_hub's own timeouts and retries. None when the host can be reached."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants, snapshot_download

    if constants.HF_HUB_OFFLINE:
        return None
    parts = urlsplit(endpoint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname or "", port), timeout=3).close()
        return None
    except (ConnectionRefusedError, socket.gaierror, ValueError):
        return str(snapshot_download(repo, local_files_only=True, **kwargs))
    except OSError:  # a timeout or an unreachable network: huggingface_hub decides
        return None


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TensorFile(Mapping[str, np.ndarray]):
    """The tensors of a checkpoint's weights file, checked once and read when a runtime asks.

    Every name, shape, dtype and value is checked at load (one tensor at a time); nothing is kept in
    memory afterwards: a runtime reads what it needs in the form it needs (`weights[name]` as float32,
    `stored(name)` as the file holds it, fp16 in published checkpoints), so a loaded model holds one copy
    of its weights, the runtime's, not the file's as well. A file changed after loading is refused."""

    def __init__(self, path: Path, expected: Mapping[str, tuple[int, ...]]):
        from safetensors import SafetensorError

        if not path.is_file():
            raise CheckpointError(f"{path}: file not found")
        self.path, self.shapes = path, {name: tuple(shape) for name, shape in expected.items()}
        try:
            self._check()
        except CheckpointError:
            raise
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
        stat = path.stat()
        self._identity = (stat.st_size, stat.st_mtime_ns)

    def _check(self) -> None:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="numpy") as handle:
            names = set(handle.keys())
            missing = sorted(set(self.shapes) - names)
            extra = sorted(names - set(self.shapes))
            if missing:
                raise CheckpointError(f"{self.path}: missing tensor {missing[0]!r}" + _more(missing))
            if extra:
                raise CheckpointError(f"{self.path}: unexpected tensor {extra[0]!r}" + _more(extra))
            for name, shape in self.shapes.items():
                got = tuple(handle.get_slice(name).get_shape())
                if got != shape:
                    raise CheckpointError(f"{self.path}: tensor {name!r} has shape {got}, expected {shape}")
            for name in self.shapes:
                array = handle.get_tensor(name)
                if not np.issubdtype(array.dtype, np.floating):
                    raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {array.dtype}, expected floats")
                if not np.isfinite(array).all():
                    raise CheckpointError(f"{self.path}: tensor {name!r} holds NaN or infinite values")

    def stored(self, name: str) -> np.ndarray:
        """Tensor `name` in the file's own dtype."""
        from safetensors import safe_open

        if name not in self.shapes:
            raise KeyError(name)
        stat = self.path.stat()
        if (stat.st_size, stat.st_mtime_ns) != self._identity:
            raise CheckpointError(f"{self.path}: the weights file changed after the checkpoint was loaded; "
                                  "load it again")
        with safe_open(str(self.path), framework="numpy") as handle:
            return handle.get_tensor(name)

    def __getitem__(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.stored(name), dtype=np.float32)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


@dataclass
class Checkpoint:
    """A loaded checkpoint: configs, tokenizer and its checked weights file, shared by every runtime."""

    path: Path
    config: AgentConfig
    encoder: EncoderConfig
    tokenizer: Tokenizer
    weights: Mapping[str, np.ndarray] = field(repr=False)  # a TensorFile, or {} for a bundle
    source: str = ""

    @cached_property
    def sha256(self) -> str:
        """Digest of the weights file: the identity of exported bundles and caches."""
        return sha256_of(self.path / WEIGHTS_FILE)

    @cached_property
    def fingerprint(self) -> str:
        """Digest of everything that decides the answers: weights, both configs and the tokenizer.

        Two checkpoints can share weights and differ in config (RoPE thetas) or tokenizer, so a cache
        of exported bundles must be keyed by this, never by the weights alone.
        """
        digest = hashlib.sha256(self.sha256.encode())
        for rel in (CONFIG_FILE, ENCODER_CONFIG):
            digest.update(rel.encode() + (self.path / rel).read_bytes())
        for path in sorted((self.path / TOKENIZER_DIR).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(self.path)).encode() + path.read_bytes())
        return digest.hexdigest()

    def stored(self, name: str) -> np.ndarray:
        """Tensor `name` in the file's own dtype: runtimes keep the embedding table as published (fp16,
        half a float32 copy's memory) and widen only the rows they gather."""
        weights = self.weights
        return weights.stored(name) if isinstance(weights, TensorFile) else np.asarray(weights[name])

    @property
    def n_parameters(self) -> int:
        shapes = getattr(self.weights, "shapes", {})
        return int(sum(np.prod(shape) for name, shape in shapes.items() if name != "temperature"))


def load_checkpoint(
    folder: Path, *, sha256: Mapping[str, str] | None = None, source: str = "", weights: bool = True
) -> Checkpoint:
    """Load a checkpoint folder strictly; `sha256` maps relative paths to digests checked first.

    `weights=False` reads configs and tokenizer only (a runtime bundle carries its own graph).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder")
    if sha256:
        verify_digests(folder, sha256)
    config = AgentConfig.from_dict(read_json(folder / CONFIG_FILE), folder / CONFIG_FILE)
    encoder = EncoderConfig.from_dict(read_json(folder / ENCODER_CONFIG), folder / ENCODER_CONFIG)
    tokenizer = Tokenizer.from_dir(folder / TOKENIZER_DIR)
    if tokenizer.vocab_size > encoder.vocab_size:
        raise CheckpointError(
            f"{folder / TOKENIZER_DIR}: the tokenizer has {tokenizer.vocab_size} tokens but the encoder's "
            f"embedding table only {encoder.vocab_size} rows"
        )
    if encoder.hidden_size % 64:
        raise CheckpointError(
            f"{folder / ENCODER_CONFIG}: hidden_size {encoder.hidden_size} is not a multiple of 64 "
            "(the decision head uses heads of 64)"
        )
    tensors = TensorFile(folder / WEIGHTS_FILE, checkpoint_tensors(config, encoder)) if weights else {}
    return Checkpoint(
        path=folder, config=config, encoder=encoder, tokenizer=tokenizer, weights=tensors,
        source=source or str(folder),
    )
