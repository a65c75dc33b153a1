"""A model's digest names its artifacts' content: a changed byte in any file changes it (a tokenizer file
inside a folder included), where a digest of names alone would let a swapped file pass as the same."""

from __future__ import annotations

from laya.digests import digest_tree, digests_of, short_digest


def test_the_digest_changes_with_any_files_content_not_only_its_name(tmp_path):
    weights, tokenizer = tmp_path / "model.safetensors", tmp_path / "tokenizer"
    weights.write_bytes(b"\x00" * 64)
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text('{"vocab": {"a": 0, "b": 1}}')
    (tokenizer / "special_tokens_map.json").write_text("{}")
    files = {"weights": weights, "tokenizer": tokenizer}
    before = digests_of(files)
    name = short_digest(before)

    (tokenizer / "tokenizer.json").write_text('{"vocab": {"a": 1, "b": 0}}')  # same name, same size
    after = digests_of(files)
    assert after["tokenizer"] != before["tokenizer"] and after["weights"] == before["weights"]
    assert short_digest(after) != name

    weights.write_bytes(b"\x00" * 63 + b"\x01")
    assert digest_tree(weights) != before["weights"] and short_digest(digests_of(files)) != name
