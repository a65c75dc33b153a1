"""A student cut from a checkpoint (`laya.training.shrink`): which layers it keeps, and that what it keeps is
the teacher's own, in the published format."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_quiet
from safetensors.numpy import load_file

from laya.encoder.config import EncoderConfig
from laya.errors import CheckpointError
from laya.testing.checkpoints import TestCheckpointSpec as Spec
from laya.testing.checkpoints import write_test_checkpoint
from laya.testing.routing_task import QUESTION, routing_lines
from laya.training.shrink import kept_layers, shrink


def encoder(layers: int, every: int = 3, layer_types: tuple[str, ...] = ()) -> EncoderConfig:
    return EncoderConfig(vocab_size=8, hidden_size=8, num_hidden_layers=layers, num_attention_heads=1,
                         intermediate_size=8, global_attn_every_n_layers=every, layer_types=layer_types)


@pytest.mark.parametrize(("layers", "n", "want"), [
    (22, 6, [0, 4, 8, 12, 17, 20]), (22, 4, [0, 7, 14, 21]), (22, 22, list(range(22))), (22, 1, [0]),
    (28, 6, [0, 5, 11, 15, 22, 26]), (4, 2, [0, 2])])
def test_a_student_keeps_every_kind_of_attention_in_its_place_spread_over_the_depth(layers, n, want):
    """Student layer j comes from a teacher layer of the kind position j has (global when j % 3 == 0), so
    every loader reads each kept layer with its own attention and rotary base; first layer first."""
    enc = encoder(layers)
    kept = kept_layers(enc, n)
    assert kept == want
    assert [enc.is_global(t) for t in kept] == [j % 3 == 0 for j in range(n)]
    assert kept == sorted(set(kept))


def test_explicit_layer_types_are_what_decides_a_layers_kind():
    """A config that lists its layers' kinds (transformers 5) is read by those, not by the rule."""
    kinds = tuple("full_attention" if i in (0, 1, 5) else "sliding_attention" for i in range(6))
    assert kept_layers(encoder(6, layer_types=kinds), 3) == [0, 2, 4]
    assert kept_layers(encoder(6, layer_types=kinds), 4) == [0, 2, 3, 5]
    with pytest.raises(CheckpointError, match="cannot give a 5-layer student"):
        kept_layers(encoder(6, layer_types=kinds), 5)


@pytest.mark.parametrize("n", [0, -1, 23])
def test_a_depth_the_encoder_does_not_have_is_refused(n):
    with pytest.raises(CheckpointError, match="1 to 22"):
        kept_layers(encoder(22), n)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("shrink") / "six",
                                 Spec(flavour="mmbert", seed=4, num_layers=6))


def test_keeping_every_layer_gives_the_teachers_answers_bit_for_bit(source, tmp_path):
    same = shrink(source, 6, tmp_path / "same")
    states = [line["state"] for line in routing_lines(4, seed=2)]
    want = load_quiet(source, runtime="torch").predict_batch(states, QUESTION)
    got = load_quiet(same, runtime="torch").predict_batch(states, QUESTION)
    assert [a["answers"] for a in got] == [a["answers"] for a in want]


def test_a_two_layer_student_holds_the_teachers_tensors_renumbered(source, tmp_path):
    student = shrink(source, 2, tmp_path / "two")
    teacher_w, student_w = load_file(source / "model.safetensors"), load_file(student / "model.safetensors")
    assert sorted(student_w) == sorted(k for k in teacher_w if not k.startswith("encoder.layers.")
                                       or k.split(".")[2] in ("0", "1"))
    for name, value in student_w.items():
        original = name.replace("encoder.layers.1.", "encoder.layers.5.")
        assert value.dtype == teacher_w[original].dtype
        np.testing.assert_array_equal(value, teacher_w[original])
    config = json.loads((student / "encoder" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert config["layer_types"] == ["full_attention", "sliding_attention"]
    assert config["rope_parameters"] == json.loads((source / "encoder" / "config.json").read_text())["rope_parameters"]
    agent = json.loads((student / "rl_agent_config.json").read_text())
    assert agent["student"] == {"teacher_layers": 6, "kept_layers": [0, 5]}
    answer = load_quiet(student, runtime="torch").predict("I was charged twice", QUESTION)["answers"]["team"]
    assert abs(sum(answer["probabilities"].values()) - 1) < 1e-6
