"""One laya GGUF for the ecosystem: llama.cpp's own laya format, written by `laya export gguf`, served by
stock llama.cpp (PyPI's `xllamacpp`, build 11549, flash attention off) and read back by laya.

- laya answers upstream's golden cases from its own file (1e-4 in f32), on its llama runtime and on the
  reference runtime, for both golden checkpoints.
- Stock llama.cpp answers as laya does (1e-4) wherever its input rules equal upstream's (the same
  tokens: llama.cpp does not cut the state to `max_len`, answers choices whose markers overflow, ignores
  noul `labels`, renders JSON numbers with 6 significant digits and applies no NFC;
  docs/notes/llama-cpp-laya.md lists each). Its `mmbert` pre-tokenizer starts every text with an escaped
  space, so the mmBERT file is one whose tokenizer does; the export says so of one that does not.
- laya loads a file in llama.cpp's layout with none of laya's keys (the file llama.cpp's converter
  writes): the tokenizer rebuilt from the vocabulary gives the same rows, the answers are the
  checkpoint's, and the missing act head is a null with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN, load_quiet, need

need("gguf", "the [llama] extra is not installed")

import laya  # noqa: E402
from laya.encoder.checkpoint import load_checkpoint  # noqa: E402
from laya.encoder.export.laya_gguf import export, write_laya_gguf  # noqa: E402
from laya.encoder.gguf_file import decision_type, unpack  # noqa: E402
from laya.encoder.head_layout import NO_ACT_HEAD  # noqa: E402
from laya.encoder.rows import build_rows  # noqa: E402
from laya.questions import parse_questions  # noqa: E402

RECORD = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
# cases whose input llama.cpp's server reads by other rules than upstream's (see the module docstring)
OTHER_RULES = {"choice-too-many", "noul-labels", "noul-cased-keys", "choice-numeric-labels", "instructions-number",
               "score-five-structured", "empty-descriptions"}


def probabilities(answer: dict) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1.0 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def stock_server(path: Path):
    """Stock llama.cpp's server on one file, flash attention off (on the CPU it casts K and V to f16)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = params.n_batch = params.n_ubatch = 8192  # one question's prompt is one batch
    params.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cpuparams.n_threads = 2
    params.warmup = False
    return xllamacpp.Server(params)


def llama_cpp_mmbert(folder: Path) -> Path:
    """The golden mmBERT checkpoint with the Metaspace scheme llama.cpp's `mmbert` pre-tokenizer implements
    (an escaped space before every text): the generated one says `never`, which llama.cpp cannot follow."""
    out = folder / "mmbert-first"
    shutil.copytree(GOLDEN / RECORD["checkpoints"]["mmbert"], out)
    path = out / "tokenizer" / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for part in ("pre_tokenizer", "decoder"):
        data[part]["prepend_scheme"] = "first"
    path.write_text(json.dumps(data), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Each checkpoint as laya's f32 GGUF, and as the file llama.cpp's converter would write: the golden
    ModernBERT and the mmBERT whose tokenizer llama.cpp can follow."""
    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, source in (("modernbert", GOLDEN / RECORD["checkpoints"]["modernbert"]),
                         ("mmbert-first", llama_cpp_mmbert(folder))):
        checkpoint = load_checkpoint(source)
        written = export(checkpoint, folder / f"{name}.gguf", "f32")
        write_laya_gguf(checkpoint, folder / f"{name}-plain.gguf", "f32", extras=False)
        out[name] = (folder / f"{name}.gguf", folder / f"{name}-plain.gguf", source, written)
    return out


def test_what_laya_writes_is_a_laya_decision_gguf(files):
    import gguf

    laya_file, plain, _, written = files["modernbert"]
    assert written["llama_cpp_notes"] == [] and written["gate"] is None
    assert decision_type(laya_file) == decision_type(plain) == "laya"
    reader = gguf.GGUFReader(str(laya_file))
    fields = {name: f.contents() for name, f in reader.fields.items() if not name.startswith("laya.act_head")}
    assert fields["general.architecture"] == "modern-bert" and fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["modern-bert.decision.block_count"] == 2 and fields["tokenizer.ggml.token_type_count"] == 3
    assert "tokenizer.chat_template.systemone" in fields and fields["tokenizer.ggml.pre"] == "modern-bert"
    # the temperatures as upstream loads them: the checkpoint's 0.1006 for 11+ options clamped to 0.5
    assert fields["modern-bert.decision.temperature.choice.11"] == pytest.approx(0.5)
    names = {t.name for t in reader.tensors}
    assert {"token_types.weight", "cls.norm.bias", "cls.output.weight", "blk.4.attn_qkv.bias"} <= names
    assert not any(n.startswith("laya") or "act" in n for n in names)  # llama.cpp refuses tensors it does not use
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["token_types.weight"] == "F32"  # llama.cpp aborts on an F16 one
    assert "laya.max_len" in fields and "laya.act_head.0.weight" in reader.fields
    assert not any(k.startswith("laya.") for k in gguf.GGUFReader(str(plain)).fields)


def test_laya_loads_its_gguf_and_answers_the_goldens(tmp_path, files):
    """The file on laya's llama runtime (its own types) and dequantized on the reference runtime, for both
    golden checkpoints (the generated mmBERT tokenizer is carried exactly, whatever llama.cpp makes of it)."""
    mmbert = export(load_checkpoint(GOLDEN / RECORD["checkpoints"]["mmbert"]), tmp_path / "mmbert.gguf", "f32")
    assert any("prepend_scheme is ['never']" in note for note in mmbert["llama_cpp_notes"])
    compared = 0
    for name, path in (("modernbert", files["modernbert"][0]), ("mmbert", tmp_path / "mmbert.gguf")):
        on_llama = laya.load(path)
        on_torch = load_quiet(path, "torch")
        assert on_llama.runtime.name == "llama" and on_llama.name == path.stem
        for case in RECORD["cases"]:
            if case["checkpoint"] != name or "response" not in case or case["id"] in OTHER_RULES:
                continue
            want = case["response"]
            for model in (on_llama, on_torch):
                got = model.predict(case["state"], case["questions"])
                assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"], case["id"]
                for qid, answer in want["answers"].items():
                    dp = np.max(np.abs(probabilities(got["answers"][qid]) - probabilities(answer)))
                    assert dp <= 1e-4, (name, case["id"], qid, dp)
                compared += 1
    assert compared >= 60


def test_a_file_without_lays_keys_answers_as_its_checkpoint(files):
    """llama.cpp's layout alone: the tokenizer is rebuilt from the vocabulary (the same rows), max_len
    inferred and said, and the act probability is null with the reason."""
    for name, (_, plain, folder, _) in files.items():
        source = load_quiet(folder)
        unpacked = unpack(plain)
        assert any("rebuilt" in note for note in unpacked.notes) and any("max_len" in note for note in unpacked.notes)
        model = laya.load(plain)
        checkpoint = "mmbert" if name.startswith("mmbert") else name
        cases = [c for c in RECORD["cases"] if c["checkpoint"] == checkpoint and "response" in c
                 and c["id"] not in OTHER_RULES]
        assert len(cases) >= 30
        for case in cases:
            questions = parse_questions(case["questions"])
            mine = build_rows(model.tokenizer, case["state"], questions, source.max_len, source.head_max_len)
            theirs = build_rows(source.tokenizer, case["state"], questions, source.max_len, source.head_max_len)
            assert [r.ids for r in mine] == [r.ids for r in theirs], (name, case["id"])
        got = model.predict("refund please", {"u": {"type": "noul", "instructions": "Urgent?"}})
        want = source.predict("refund please", {"u": {"type": "noul", "instructions": "Urgent?"}})
        assert got["answers"]["u"]["noul"] == pytest.approx(want["answers"]["u"]["noul"], abs=1e-4)
        assert got["answers"]["u"]["x_act_probability"] is None
        assert got["answers"]["u"]["x_act_reason"] == NO_ACT_HEAD


def test_stock_llama_cpp_serves_what_laya_writes(files):
    """Stock llama.cpp on laya's file against upstream's golden answers (the mmBERT whose tokenizer it can
    follow has none: against laya on the same file, which equals upstream by the test above), on every
    golden case both read by the same rules into the same number of tokens."""
    need("xllamacpp", "xllamacpp (stock llama.cpp, the [dev] extra) is not installed")
    compared = {}
    for name, (path, _, _, _) in files.items():
        server = stock_server(path)
        ours = laya.load(path)
        checkpoint = "mmbert" if name.startswith("mmbert") else name
        for case in RECORD["cases"]:
            if case["checkpoint"] != checkpoint or "response" not in case or case["id"] in OTHER_RULES:
                continue
            theirs = server.handle_systemone({"state": case["state"], "questions": case["questions"]})
            if "error" in theirs:
                continue  # a request llama.cpp's server reads otherwise (the list above has the known ones)
            # upstream's own answer where the golden checkpoint is the one served, else laya's on the file
            mine = case["response"] if name == checkpoint else ours.predict(case["state"], case["questions"])
            if theirs["usage"]["input_tokens"] != mine["usage"]["input_tokens"]:
                continue  # not the same input (an uncut state, other tokens): not a comparison
            for qid, answer in mine["answers"].items():
                dp = np.max(np.abs(probabilities(theirs["answers"][qid]) - probabilities(answer)))
                assert dp <= 1e-4, (name, case["id"], qid, dp)
            compared[name] = compared.get(name, 0) + 1
        del server
    assert compared.get("modernbert", 0) >= 30 and compared.get("mmbert-first", 0) >= 15, compared


def test_serve_takes_a_laya_gguf_as_a_laya_model(files):
    """`laya serve -m model.gguf`: a laya decision GGUF is served by the encoder engine (a chat GGUF still
    goes to the decide engine), and the answer carries the act head laya's keys keep."""
    from laya.encoder.engine import EncoderEngine
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    path = files["modernbert"][0]
    engine = load_engine(ModelSpec.parse(f"mine={path}"), ServeOptions(engine_process=False))
    assert isinstance(engine, EncoderEngine) and engine.model.runtime.name == "llama"
    got = engine.model.predict("refund please", {"u": {"type": "noul", "instructions": "Urgent?"}})
    assert got["model"] == "mine" and 0 < got["answers"]["u"]["x_act_probability"] < 1


def test_without_llama_cpp_a_gguf_runs_dequantized_on_the_default_runtime(files, monkeypatch):
    """No compiler, no llama.cpp: the file still loads (its weights dequantized, the default runtime)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    path = files["modernbert"][0]
    model = load_quiet(path)
    assert model.runtime.name != "llama"
    got = model.predict("refund please", {"u": {"type": "noul", "instructions": "Urgent?"}})
    want = laya.load(path).predict("refund please", {"u": {"type": "noul", "instructions": "Urgent?"}})
    assert got["answers"]["u"]["noul"] == pytest.approx(want["answers"]["u"]["noul"], abs=0.05)


def test_reduced_types_are_gated_on_the_file_and_served_by_stock_llama_cpp(tmp_path):
    """f16 and q8_0: the gate is measured on the file read back and stored in it; laya's answers stay in
    the gate's bound, and so do stock llama.cpp's on the quantized file."""
    import gguf

    checkpoint = load_checkpoint(GOLDEN / RECORD["checkpoints"]["modernbert"])
    reference = laya.load(GOLDEN / RECORD["checkpoints"]["modernbert"], "torch")
    questions = {"u": {"type": "noul", "instructions": "Urgent?"},
                 "t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "money", "sales": None}}}
    for kind, tensor_type in (("f16", "F16"), ("q8_0", "Q8_0")):
        written = export(checkpoint, tmp_path / f"m-{kind}.gguf", kind)
        gate = written["gate"]
        assert gate["passed"] and gate["precision"] == kind and gate["max_dp"] > 0
        reader = gguf.GGUFReader(str(tmp_path / f"m-{kind}.gguf"))
        assert json.loads(reader.fields["laya.encoder.gate"].contents())["max_dp"] == gate["max_dp"]
        assert {t.tensor_type.name for t in reader.tensors} >= {tensor_type, "F32"}
        model = laya.load(tmp_path / f"m-{kind}.gguf")
        assert model.runtime.precision == kind and model.runtime.gate["max_dp"] == gate["max_dp"]
        got, want = model.predict("refund please", questions), reference.predict("refund please", questions)
        for qid in questions:
            dp = np.max(np.abs(probabilities(got["answers"][qid]) - probabilities(want["answers"][qid])))
            assert dp <= max(gate["max_dp"], 1e-3) * 2, (kind, qid, dp)
    if importlib.util.find_spec("xllamacpp") is not None:
        server = stock_server(tmp_path / "m-q8_0.gguf")
        theirs = server.handle_systemone({"state": "refund please", "questions": questions})
        for qid in questions:  # the q8_0 file's gate holds for stock llama.cpp too: its build rounds the
            # activations its own way (on an AVX2 EPYC 0.0027 from laya's answers, 0.0044 from fp32; gate 0.018)
            dp = np.max(np.abs(probabilities(theirs["answers"][qid]) - probabilities(want["answers"][qid])))
            assert dp <= max(gate["max_dp"], 1e-3) * 2, (qid, dp)
