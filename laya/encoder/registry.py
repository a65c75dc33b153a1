"""The published laya checkpoints: where they live on the Hub, pinned, with their weights' digest.

`laya.load("laya-multilingual")` resolves through here, so a name always means the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    repo: str
    revision: str
    weights_sha256: str
    max_len: int
    head_max_len: int
    description: str
    subfolder: str | None = None


REGISTRY: dict[str, RegisteredModel] = {
    m.name: m
    for m in (
        RegisteredModel(
            name="laya",
            repo="convaiinnovations/laya",
            revision="55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
            weights_sha256="891102d372688fc2a094dac56a384bc537b87c63f21f9f3dac0be2b7cbc8d86c",
            max_len=512,
            head_max_len=192,
            description="English laya: ModernBERT-large encoder with a decision head",
        ),
        RegisteredModel(
            name="laya-multilingual",
            repo="convaiinnovations/laya-multilingual",
            revision="052592a15d198d9ad47da779604259b10b47b7aa",
            weights_sha256="9d628fd971b700382ac6f65920a86f149777b2e748e0c955fb3b19695aa8f204",
            max_len=1024,
            head_max_len=256,
            description="Multilingual laya: mmBERT-base encoder with a decision head",
        ),
        RegisteredModel(
            name="laya-typed-decisions",
            repo="convaiinnovations/laya-typed-decisions",
            revision="f9ab0b228f0fc0f14d873dbc99038f135c2da1b2",
            weights_sha256="4fa56de72383a9d3efa9cfa78955733c81b9fc8067a587ca4beb82c78107a24e",
            max_len=1024,
            head_max_len=256,
            description="laya typed decisions: ModernBERT-large encoder with a decision head",
        ),
    )
}


def lookup(name: str) -> RegisteredModel | None:
    return REGISTRY.get(name.lower())
