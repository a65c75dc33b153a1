"""Strict checkpoint loading: every defect is an error naming the file (and tensor); nothing loads half."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import load_quiet
from safetensors.numpy import load_file, save_file

import laya
from laya.encoder.checkpoint import load_checkpoint, sha256_of
from laya.encoder.registry import REGISTRY
from laya.errors import CheckpointError


@pytest.fixture
def ck(checkpoint_dir, tmp_path) -> Path:
    target = tmp_path / "ck"
    shutil.copytree(checkpoint_dir, target)
    return target


def rewrite_weights(folder: Path, change) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    change(weights)
    save_file(weights, str(folder / "model.safetensors"))


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_loads_and_leaves_files_untouched(ck):
    before = tree_digest(ck)
    checkpoint = load_checkpoint(ck)
    assert tree_digest(ck) == before
    assert checkpoint.weights["encoder.embeddings.tok_embeddings.weight"].dtype == np.float32
    assert checkpoint.config.n_act == 2


@pytest.mark.parametrize("name", ["type_emb.weight", "encoder.layers.2.attn.Wqkv.weight", "act_head.2.bias",
                                  "head.layers.1.norm2.bias", "temperature"])
def test_removed_tensor_is_named(ck, name):
    rewrite_weights(ck, lambda w: w.pop(name))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: missing tensor '{name}'"):
        load_checkpoint(ck)


@pytest.mark.parametrize("name", ["scorer.1.weight", "encoder.final_norm.weight"])
def test_renamed_tensor_is_named(ck, name):
    rewrite_weights(ck, lambda w: w.__setitem__(name + "_old", w.pop(name)))
    with pytest.raises(CheckpointError, match=f"missing tensor '{name}'"):
        load_checkpoint(ck)


def test_added_tensor_is_named(ck):
    rewrite_weights(ck, lambda w: w.__setitem__("head.layers.2.linear1.weight", np.zeros((4, 4), np.float16)))
    with pytest.raises(CheckpointError, match="unexpected tensor 'head.layers.2.linear1.weight'"):
        load_checkpoint(ck)


@pytest.mark.parametrize("name", ["encoder.layers.1.mlp.Wi.weight", "act_head.0.weight", "scorer.3.bias"])
def test_reshaped_tensor_is_named(ck, name):
    def reshape(w):
        w[name] = np.zeros((*w[name].shape[:-1], w[name].shape[-1] + 1), np.float16)

    rewrite_weights(ck, reshape)
    with pytest.raises(CheckpointError, match=f"tensor '{name}' has shape"):
        load_checkpoint(ck)


@pytest.mark.parametrize("rel", ["rl_agent_config.json", "model.safetensors", "encoder/config.json",
                                 "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"])
def test_missing_file_is_named(ck, rel):
    (ck / rel).unlink()
    with pytest.raises(CheckpointError, match=rf"{rel}: file not found"):
        load_checkpoint(ck)


def test_corrupt_safetensors(ck):
    data = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_checkpoint(ck)
    (ck / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ck)


def test_non_finite_weights(ck):
    def poison(w):
        w["scorer.1.bias"][3] = np.inf

    rewrite_weights(ck, poison)
    with pytest.raises(CheckpointError, match="'scorer.1.bias' holds NaN or infinite"):
        load_checkpoint(ck)


def test_non_modernbert_encoder(ck):
    cfg = json.loads((ck / "encoder/config.json").read_text())
    cfg["model_type"] = "bert"
    (ck / "encoder/config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="encoder/config.json: model_type 'bert' is not supported"):
        load_checkpoint(ck)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.pop("encoder"), "'encoder' must be"),
        (lambda c: c.update(temperature=[1, 2]), "'temperature' must be a list of 3"),
        (lambda c: c.update(head_layers=-1), "'head_layers' must be an integer"),
        (lambda c: c.update(max_len="512"), "'max_len' must be an integer"),
        (lambda c: c.update(option_layout="parallel"), "option_layout 'parallel' is not supported"),
        (lambda c: c.update(act_costs=[1]), "'act_costs' must be an object"),
    ],
)
def test_bad_agent_config(ck, change, message):
    cfg = json.loads((ck / "rl_agent_config.json").read_text())
    change(cfg)
    (ck / "rl_agent_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"rl_agent_config.json: {message}"):
        load_checkpoint(ck)


def test_agent_config_not_json(ck):
    (ck / "rl_agent_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="rl_agent_config.json: not valid JSON"):
        load_checkpoint(ck)


def test_unknown_config_keys_are_ignored(ck):
    cfg = json.loads((ck / "rl_agent_config.json").read_text())
    cfg["future_option"] = {"anything": True}
    (ck / "rl_agent_config.json").write_text(json.dumps(cfg))
    load_checkpoint(ck)


def test_act_costs_size_the_act_head(ck):
    cfg = json.loads((ck / "rl_agent_config.json").read_text())
    cfg["act_costs"] = {"a": 1, "b": 2}
    (ck / "rl_agent_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'act_head.2.weight' has shape \(2, 256\), expected \(3, 256\)"):
        load_checkpoint(ck)


def test_sha256_is_checked_before_parsing(ck):
    good = sha256_of(ck / "model.safetensors")
    load_checkpoint(ck, sha256={"model.safetensors": good})
    (ck / "model.safetensors").write_bytes(b"garbage")  # would fail parsing, but the digest fails first
    with pytest.raises(CheckpointError, match="sha256 .* does not match"):
        load_checkpoint(ck, sha256={"model.safetensors": good})


def test_sha256_through_load(ck):
    with pytest.raises(CheckpointError, match="does not match"):
        laya.load(ck, sha256="0" * 64)


def test_transformers5_quirks_are_read(mmbert_dir):
    # the mmbert flavour ships rope_parameters, TokenizersBackend and list-valued extra_special_tokens
    tcfg = json.loads((mmbert_dir / "tokenizer/tokenizer_config.json").read_text())
    assert tcfg["tokenizer_class"] == "TokenizersBackend" and isinstance(tcfg["extra_special_tokens"], list)
    before = tree_digest(mmbert_dir)
    checkpoint = load_checkpoint(mmbert_dir)
    assert checkpoint.encoder.global_rope_theta == 160000 and checkpoint.encoder.local_rope_theta == 160000
    tok = checkpoint.tokenizer
    assert (tok.cls_id, tok.sep_id, tok.mask_id, tok.pad_id) == (2, 1, 4, 0)
    assert tree_digest(mmbert_dir) == before


def test_classic_rope_keys(checkpoint_dir):
    enc = load_checkpoint(checkpoint_dir).encoder
    assert (enc.global_rope_theta, enc.local_rope_theta) == (160000, 10000)
    assert [enc.is_global(i) for i in range(4)] == [True, False, False, True]


def test_special_tokens_as_added_token_dicts(ck):
    cfg = json.loads((ck / "tokenizer/tokenizer_config.json").read_text())
    cfg["mask_token"] = {"content": cfg["mask_token"], "lstrip": True, "special": True}
    (ck / "tokenizer/tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_checkpoint(ck).tokenizer.mask_token == "[MASK]"


def test_special_token_missing_from_vocabulary(ck):
    cfg = json.loads((ck / "tokenizer/tokenizer_config.json").read_text())
    cfg["mask_token"] = "<nope>"
    (ck / "tokenizer/tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="mask_token '<nope>' is not in the vocabulary"):
        load_checkpoint(ck)


def fake_hub(tmp_path, monkeypatch, repo: str, revision: str, source: Path, subfolder: str | None = None):
    """A Hugging Face cache holding `source` at `revision`, with the Hub offline."""
    from huggingface_hub import constants

    storage = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / revision
    shutil.copytree(source, snapshot / subfolder if subfolder else snapshot)
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_hub_id_from_the_offline_cache(tmp_path, monkeypatch, checkpoint_dir):
    fake_hub(tmp_path, monkeypatch, "acme/tiny", "a" * 40, checkpoint_dir, subfolder="multilingual")
    model = load_quiet("acme/tiny", subfolder="multilingual")
    assert model.name == "tiny-multilingual"
    assert model.predict("x", {"q": {"type": "noul"}})["answers"]["q"]["type"] == "noul"
    pinned = load_quiet("acme/tiny", subfolder="multilingual", revision="a" * 40)
    assert pinned.checkpoint.path.parent.name == "a" * 40


def test_hub_miss_offline_is_a_clear_error(tmp_path, monkeypatch, checkpoint_dir):
    fake_hub(tmp_path, monkeypatch, "acme/tiny", "a" * 40, checkpoint_dir)
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        laya.load("acme/other")
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        laya.load("acme/tiny", revision="b" * 40)


def test_registry_pins_revision_and_digest(tmp_path, monkeypatch, checkpoint_dir):
    entry = REGISTRY["laya-multilingual"]
    assert entry.repo == "convaiinnovations/laya-multilingual" and len(entry.revision) == 40
    fake_hub(tmp_path, monkeypatch, entry.repo, entry.revision, checkpoint_dir)
    # found at the pinned revision in the cache, then refused: these are not the published weights
    with pytest.raises(CheckpointError, match=f"does not match the expected {entry.weights_sha256}"):
        laya.load("laya-multilingual")


def test_registry_budgets():
    assert {n: (m.max_len, m.head_max_len) for n, m in REGISTRY.items()} == {
        "laya": (512, 192), "laya-multilingual": (1024, 256), "laya-typed-decisions": (1024, 256)}


def test_not_a_model_at_all():
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        laya.load("./does/not/exist")
    with pytest.raises(CheckpointError, match="is not a checkpoint folder, a registered model"):
        laya.load("nonsense")


def test_pinned_commit_in_cache_needs_no_network(tmp_path, monkeypatch, checkpoint_dir):
    from huggingface_hub import constants

    fake_hub(tmp_path, monkeypatch, "acme/tiny", "c" * 40, checkpoint_dir)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # any request would fail at once
    assert load_quiet("acme/tiny", revision="c" * 40).checkpoint.path.name == "c" * 40
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        laya.load("acme/tiny", revision="d" * 40, local_only=True)
