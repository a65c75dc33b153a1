"""A small mutation check: plant known bugs, one at a time, and see that a test goes red for each.

    .venv/bin/python scripts/mutants.py              # every mutant, a baseline run first
    .venv/bin/python scripts/mutants.py --list       # names, files and the tests that should catch each
    .venv/bin/python scripts/mutants.py tree-no-restore rows-no-cut   # some of them (fnmatch patterns too)

Each mutant is a snippet of one module of `laya/` (it must occur exactly once) and what
replaces it. The script copies `laya/` into a temporary folder, plants the bug there, and runs the mutant's tests
from this checkout with that copy first on `PYTHONPATH` (the checkout itself is never written to, so
it is safe while others run tests from it). A mutant is `caught` when its tests fail, `survived` when
they pass. The baseline runs every named test on an unmutated copy first: a test that fails there
proves nothing. Exit status 1 if a mutant survived or the baseline failed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the checkout
    original: str
    mutated: str
    tests: tuple[str, ...]  # pytest node ids, relative to the checkout
    what: str = ""


POLICY = "laya/decide/policy.py"
ROWS = "laya/encoder/rows.py"
ADMISSION = "laya/server/admission.py"
BATCHER = "laya/server/batcher.py"
BODY = "laya/server/body.py"
REMOTE = "laya/server/remote.py"
ENGINE_LOOP = "laya/server/engine_loop.py"
PROGRESS = "laya/server/progress.py"
ONNX = "laya/encoder/runtimes/onnx.py"
ONNX_EXPORT = "laya/encoder/export/onnx.py"
GRAPH_TEST = ("tests/test_onnx.py::test_the_graph_runs_fused_kernels_and_splits_no_product",)
TEMPS = "laya/calibration/temperatures.py"

TREE_TESTS = ("tests/test_decide_policy.py",)
ROW_TESTS = ("tests/test_rows.py::test_every_row_fits_max_len_over_crowded_heads",
             "tests/test_tournament.py::test_wide_rows_match_upstream",
             "tests/test_tournament.py::test_wide_answers_match_upstream")
ADMISSION_TESTS = ("tests/test_admission.py",)
BODY_TESTS = ("tests/test_body.py",)
TEMP_TESTS = ("tests/test_temperatures.py",)
REMOTE_TESTS = ("tests/test_engine_process.py",)
RECOVERY = "tests/test_server_recovery.py"
GATES = "tests/test_precision_gates.py"
AUTO = "tests/test_auto.py"
ROWNET = "laya/encoder/runtimes/rownet.py"

MUTANTS = [
    # --- the six of the audit ---
    Mutant("tree-no-restore", POLICY, "        if passes:  # the first expansion",
           "        if False:  # the first expansion",
           TREE_TESTS, "later expansions do not restore the prompt state"),
    Mutant("tree-no-split", POLICY, "logp[group] = score - np.log(len(group))", "logp[group] = score",
           TREE_TESTS, "an unexpanded group's mass is not split among its members"),
    Mutant("rows-no-cut", ROWS, "row = (*head.ids, *kept, tok.sep_id)[:max_len]",
           "row = (*head.ids, *kept, tok.sep_id)",
           ROW_TESTS, "the final cut to max_len removed"),
    Mutant("admission-size-ignored", ADMISSION, "self.rows_per_request += 0.05 * (rows - self.rows_per_request)",
           "pass", ADMISSION_TESTS, "the queue budget ignores a request's size (note_rows does nothing)"),
    Mutant("body-gzip-uncapped", BODY, "out = inflater.decompress(data, limit + 1)", "out = inflater.decompress(data)",
           BODY_TESTS, "gzip inflated without a cap"),
    Mutant("temps-buckets-choice-only", TEMPS,
           "return self.by_bucket.get(bucket_key(qtype, n_options), self.per_type[QTYPES.index(qtype)])",
           "return (self.by_bucket.get(bucket_key(qtype, n_options), self.per_type[QTYPES.index(qtype)])\n"
           "                if qtype == \"choice\" else self.per_type[QTYPES.index(qtype)])",
           TEMP_TESTS, "bucket temperatures applied to choices only"),
    # --- collision tree ---
    Mutant("tree-end-first-only", POLICY, "logsumexp(here[end])", "float(here[end[0]])", TREE_TESTS,
           "a label that ends reads only the first end token"),
    Mutant("tree-smallest-first", POLICY, "score, group, depth, path = pending.pop()",
           "score, group, depth, path = pending.pop(0)", TREE_TESTS, "groups expanded lowest mass first"),
    Mutant("tree-winner-not-forced", POLICY, "may_win = score >= best", "may_win = False", TREE_TESTS,
           "a group that could hold the best answer is not always expanded"),
    Mutant("tree-budget-off-by-one", POLICY, "not (may_win or passes < budget)", "not (may_win or passes <= budget)",
           TREE_TESTS, "one pass more than the budget"),
    Mutant("tree-no-max-levels", POLICY, "if depth > max_levels or", "if", TREE_TESTS, "max_levels ignored"),
    Mutant("tree-levels-uncounted", POLICY, "levels = max(levels, depth + 1)", "levels = max(levels, depth)",
           TREE_TESTS, "the deepest level read is under-reported"),
    Mutant("split-no-give-back", POLICY, "return full, max(0, shared - 1)", "return full, shared", TREE_TESTS,
           "the prefix keeps the token a merge across the join changes"),
    Mutant("outside-mass-of-labels", POLICY, "np.exp(root[firsts]).sum()", "np.exp(logp).sum()", TREE_TESTS,
           "outside mass counted from the labels' joint probabilities, not their first tokens"),
    # --- rows ---
    Mutant("rows-room-unclamped", ROWS, "room = max(0, max_len - len(head.ids) - 1)",
           "room = max_len - len(head.ids) - 1",
           ROW_TESTS, "no floor at 0 on the state's room"),
    Mutant("rows-marker-at-max-len", ROWS, "fitting = sum(1 for m in head.markers if m < max_len)",
           "fitting = sum(1 for m in head.markers if m < max_len - 1)", ROW_TESTS,
           "a marker on the row's last token is refused"),
    Mutant("rows-instructions-floor", ROWS, "q = q[: max(INSTRUCTIONS_FLOOR, left)]", "q = q[:left]", ROW_TESTS,
           "no floor of 8 on the instructions"),
    Mutant("rows-threshold", ROWS, "if left < OPTIONS_MIN_LEFT:", "if left <= OPTIONS_MIN_LEFT:", ROW_TESTS,
           "the per-option cap starts one token early"),
    # --- admission and the batcher's reservation ---
    Mutant("admission-one-row", ADMISSION, "(self.inside + extra) * self.rows_per_request / rate",
           "(self.inside + extra) / rate", ADMISSION_TESTS, "the queue counted in requests of one row"),
    Mutant("admission-no-extra", ADMISSION, "self.queued_s(extra=1) > budget_s", "self.queued_s() > budget_s",
           ADMISSION_TESTS, "the request's own rows left out of its deadline budget"),
    Mutant("admission-alone-shed", ADMISSION, "and self.inside and (", "and (", ADMISSION_TESTS,
           "a request alone can be shed"),
    Mutant("admission-no-max-queue", ADMISSION, "self.queued_s() > self.max_queue_s or ", "", ADMISSION_TESTS,
           "--max-queue-ms ignored"),
    Mutant("admission-limit-off-by-one", ADMISSION, "if self.inside >= self.limit:", "if self.inside > self.limit:",
           ADMISSION_TESTS, "one request more than --max-concurrency"),
    Mutant("batcher-reserve-one-row", BATCHER, "self.pending_rows + rows > self.max_pending_rows:",
           "self.pending_rows + 1 > self.max_pending_rows:", ADMISSION_TESTS,
           "the pending-rows bound checks one row, not the request's"),
    Mutant("batcher-reserve-counts-jobs", BATCHER, "        self.pending_rows += rows\n\n    def release",
           "        self.pending_rows += 1\n\n    def release", ADMISSION_TESTS, "a reservation counts one row"),
    Mutant("batcher-release-noop", BATCHER, "        self.pending_rows -= rows\n\n    def resize",
           "        pass\n\n    def resize", ADMISSION_TESTS, "a refused request's rows are never given back"),
    # --- the engine process ---
    Mutant("remote-one-at-a-time", ENGINE_LOOP,
           "        while self.prepared and batching.has_room(rows, tokens):",
           "        while False:",
           REMOTE_TESTS, "the engine process runs one request at a time, never what queued together"),
    Mutant("remote-cancel-lost", ENGINE_LOOP,
           "return self._set or self._board[self._rid % len(self._board)] == self._rid or self.expired",
           "return self._set or self.expired", REMOTE_TESTS,
           "a cancel reaching the engine process does not stop the waiting request"),
    Mutant("remote-waits-alone", ENGINE_LOOP,
           "        if batching.max_wait_ms > 0:  # else no wait at all: what is prepared goes now\n"
           "            deadline = time.perf_counter() + batching.wait_s",
           "        if True:\n            deadline = time.perf_counter() + max(batching.max_wait_ms, 300.0) / 1000.0",
           REMOTE_TESTS,
           "an idle engine process waits for company it was not asked to wait for"),
    Mutant("onnx-keeps-spinning", ONNX, 'options.add_session_config_entry("session.force_spinning_stop", "1")',
           "pass", ("tests/test_onnx.py::test_the_thread_pool_stops_spinning_when_a_forward_pass_ends",),
           "ONNX Runtime's pool spins on after every forward pass"),
    Mutant("placement-caller-free", "laya/native/placement.py", "os.sched_setaffinity(0, (self.caller,))",
           "pass", ("tests/test_placement.py",), "the calling thread of a forward is not pinned to its own core"),
    Mutant("placement-dedicated-freed", "laya/native/placement.py", "if me == _dedicated:", "if False:",
           ("tests/test_placement.py",), "the engine process's forward thread is pinned and freed around every call"),
    Mutant("engine-thread-not-dedicated", ENGINE_LOOP, "        dedicate_this_thread()  #", "        pass  #",
           ("tests/test_placement.py::test_the_engine_process_keeps_its_forward_thread_on_one_core",),
           "the engine process does not name its main thread as the one that runs forward passes"),
    Mutant("placement-pool-free", ONNX, 'options.add_session_config_entry("session.intra_op_thread_affinities", '
           'placement.affinities())', "pass", ("tests/test_placement.py",),
           "ONNX Runtime's pool threads are not pinned to the cores left to them"),
    Mutant("question-set-unhashable", "laya/questions.py", "field(default=None, hash=False)", "None",
           ("tests/test_engine_process.py::test_every_question_type_crosses_kept_then_by_slot",
            "tests/test_served_goldens.py"), "a score question's set cannot key the engine process's slots"),
    Mutant("slot-ignores-limits", REMOTE, "        key = (request.questions, request.options, job.limits)\n",
           "        key = (request.questions, request.options)\n",
           ("tests/test_engine_process.py::test_a_slot_holds_its_limits_too",),
           "a question set asked again under other limits runs under the first request's limits"),
    Mutant("pickle-drops-a-field", "laya/response.py", "attrgetter(*(f.name for f in fields(cls)))",
           "attrgetter(*(f.name for f in fields(cls)[:-1]))", ("tests/test_response.py",),
           "an answer's last field is lost on its way across the pipe"),
    Mutant("aside-never-drained", ENGINE_LOOP, "        if any(key.fd == self.wake_r for key, _ in ready):",
           "        if False:", ("tests/test_engine_process.py::"
                                "test_large_requests_prepared_aside_and_small_ones_between_them_are_all_answered",),
           "a request prepared on the engine process's preparing thread is never run"),
    Mutant("restart-from-the-loop", REMOTE, "        self._restarts.put(delay)\n",
           "        threading.Thread(target=self._restart, args=(delay,), daemon=True).start()\n",
           ("tests/test_server_recovery.py::test_an_engine_process_started_again_runs_at_the_priority_the_first_had",),
           "an engine process started again runs at the HTTP loop's lowered priority"),
    Mutant("books-ignore-busy", "laya/server/metrics.py", "        if self.busy() and time.monotonic()",
           "        if False and time.monotonic()", ("tests/test_books.py",),
           "a request's access-log line is written while other requests are inside the server"),
    Mutant("books-never-old", "laya/server/metrics.py", "time.monotonic() - self._since < self.MAX_AGE_S",
           "True", ("tests/test_books.py",), "under steady load the books are never written"),
    Mutant("body-no-cap", BODY, "    return await call.body(limit, lambda: _too_large(limit, \"has\"))",
           "    return await call.body(1 << 62, lambda: _too_large(limit, \"has\"))", ("tests/test_body.py",),
           "a body without a declared length is read whole, past the cap"),
    Mutant("call-last-header-wins", "laya/server/call.py", "        if name not in out:\n", "        if True:\n",
           ("tests/test_call.py",), "a repeated header's last value is read where Starlette reads its first"),
    Mutant("reply-drops-headers", "laya/server/call.py", "for k, v in (self.headers or {}).items()]",
           "for k, v in {}.items()]", ("tests/test_call.py", "tests/test_server_overload.py"),
           "an answer's own headers (Retry-After) are lost"),
    Mutant("prefixed-route-unwrapped", "laya/server/routes.py",
           "app.add_api_route(path, endpoint(systemone),", "app.add_api_route(path, systemone,",
           ("tests/test_call.py",), "a decision route reached through FastAPI gets Starlette's request it cannot read"),
    Mutant("walk-skips-exponents", BODY, r'rb"[0-9](?:[eE]|[0-9]{%d})" % MAX_INT_DIGITS',
           r'rb"[0-9][0-9]{%d}" % MAX_INT_DIGITS', ("tests/test_body.py",),
           "a number that overflows to infinity is let through"),
    Mutant("validated-remembers-refusals", "laya/request.py", "        if not found:\n", "        if True:\n",
           ("tests/test_questions.py",), "a refused question set is remembered and then let through"),
    Mutant("validated-loose-key", "laya/request.py", "        key = repr(questions)\n",
           "        key = repr(sorted(questions))\n", ("tests/test_questions.py",),
           "question sets with the same ids share one remembered validation"),
    Mutant("decode-sequential-sum", "laya/decoding/floats.py", "    if n < _UNROLL:", "    if True:",
           ("tests/test_decode.py",), "decoding sums probabilities one by one, not in numpy's pairwise order"),
    Mutant("onnx-unfused", ONNX_EXPORT, "module = PortableNet.load(checkpoint, ops=ORT_FUSED)",
           "module = PortableNet.load(checkpoint)", GRAPH_TEST,
           "the ONNX graph spells RoPE, GELU and attention out in small operators"),
    Mutant("onnx-split-kept", ONNX_EXPORT,
           'manifest["split_products"] = split_products(fp32_path, out / "model.onnx")',
           'manifest["split_products"] = split_products(fp32_path, Path(tmp) / "unused.onnx")\n'
           '            shutil.copyfile(fp32_path, out / "model.onnx")', GRAPH_TEST,
           "the fp32 bundle keeps its last-axis splits of products"),
    # --- body decoding ---
    Mutant("body-zstd-uncapped", BODY, "out = reader.read(limit + 1)", "out = reader.read()", BODY_TESTS,
           "zstd inflated without a cap"),
    Mutant("body-cap-off-by-one", BODY, "if len(out) > limit:\n        raise _too_large(limit, \"decompresses to\")",
           "if len(out) > limit + 1:\n        raise _too_large(limit, \"decompresses to\")", BODY_TESTS,
           "one byte past the cap accepted"),
    Mutant("body-deflate-raw", BODY, "wbits=47 if encoding != \"deflate\" else 15",
           "wbits=47 if encoding != \"deflate\" else -15", BODY_TESTS,
           "deflate bodies read as raw deflate, not the zlib format HTTP means"),
    Mutant("body-read-uncapped", "laya/server/call.py",
           "                if size > limit:\n                    raise too_large()", "                pass",
           BODY_TESTS, "the raw body read without a cap"),
    # --- temperatures ---
    Mutant("temps-bucket-3-5", TEMPS, "if n_options <= 5:", "if n_options < 5:", TEMP_TESTS, "5 options in 6-10"),
    Mutant("temps-bucket-6-10", TEMPS, "if n_options <= 10:", "if n_options < 10:", TEMP_TESTS, "10 options in 11+"),
    Mutant("temps-type-order", TEMPS, "self.per_type[QTYPES.index(qtype)])", "self.per_type[0])", TEMP_TESTS,
           "every type falls back to the choice temperature"),
    Mutant("temps-unclamped-buckets", TEMPS, "by_bucket={str(k): clamp(v) for k, v in by_bucket.items()}",
           "by_bucket={str(k): float(v) for k, v in by_bucket.items()}", TEMP_TESTS, "bucket values not clamped"),
    # --- structured output, the chat route, plan and the door ---
    Mutant("schema-union-unchecked", "laya/structured/plan.py", "            if not isinstance(union, list):",
           "            if False:", ("tests/test_structured.py",), "a non-array anyOf/oneOf reaches the walk (a 500)"),
    Mutant("schema-surrogates", "laya/structured/plan.py", "    if (where := unencodable(root)) is not None:",
           "    if False:", ("tests/test_structured.py",), "a schema's lone surrogate reaches the answer's JSON"),
    Mutant("values-noul-strict", "laya/structured/values.py", '_rounded(answer.get("noul", 0.0)) >= 0.5',
           '_rounded(answer.get("noul", 0.0)) > 0.5', ("tests/test_structured.py",),
           "a yes/no of exactly 0.5 projects to False (upstream: True)"),
    Mutant("chat-asks-certain-fields", "laya/server/openai.py",
           "asked = questions_of([f for f in fields if not f.certain])", "asked = questions_of(fields)",
           ("tests/test_caller_http.py::test_a_literal_field_is_filled_without_inference",),
           "a const / one-value enum field is asked as a one-option choice (a 422)"),
    Mutant("plans-unbounded", ADMISSION, "        if plan and (self.plans_inside >= self.plan_limit\n",
           "        if False and (self.plans_inside >= self.plan_limit\n", ("tests/test_admission.py",),
           "a flood of plans takes the whole door and the cores"),
    Mutant("surrogate-state", "laya/questions.py",
           "    if (where := unencodable(state)) is not None:\n        return Problem(",
           "    if False:\n        return Problem(", ("tests/test_questions.py",),
           "a state with a lone surrogate reaches the tokenizer (a TypeError)"),
    # --- keys, answers about the host, supervision ---
    Mutant("key-over-plain-http", "laya/apps/outbound.py",
           'if key and parts.scheme == "http" and not is_loopback(parts.hostname):', "if False:",
           ("tests/test_outbound.py",), "a key is sent in clear to another machine"),
    Mutant("answer-uncapped", "laya/apps/outbound.py",
           "        for chunk in r.iter_bytes():\n            content += chunk\n            if len(content) > cap:",
           "        for chunk in r.iter_bytes():\n            content += chunk\n            if False:",
           ("tests/test_outbound.py",), "a server's answer is read whole, past the cap"),
    Mutant("eval-one-key-for-all", "laya/cli/evaluate.py", "        for spec in specs:\n            out[spec] = key",
           "        for spec in urls.values():\n            out[spec] = key", ("tests/test_outbound.py",),
           "laya eval sends a URL's key to every URL method"),
    Mutant("health-shows-pids", "laya/redaction.py", "if k not in PRIVATE_KEYS", "if True",
           ("tests/test_redaction.py",), "a pid or a path field leaves the server"),
    Mutant("paths-left-in-text", "laya/redaction.py", "    return _PATH.sub(lambda m: last(m.group(0)), text)",
           "    return text", ("tests/test_redaction.py",),
           "an absolute path inside an error message leaves the server"),
    Mutant("hang-unseen", PROGRESS, "        if now - self.moved_at > bounds.stall_s:", "        if False:",
           ("tests/test_server_recovery.py::test_a_hung_engine_process_is_killed_and_restarted",),
           "an engine process stuck in a forward pass is never restarted"),
    Mutant("health-open-with-key", "laya/server/routes.py",
           "    if not ctx.authorized(request):\n        return {\"status\"",
           "    if False:\n        return {\"status\"",
           ("tests/test_server.py::test_a_key_guards_what_it_should",),
           "with a key, /health tells anyone what is loaded"),
    Mutant("mcp-key-ignored", "laya/apps/mcp.py", '        return key_given(header.decode("latin-1"), self.key)',
           "        return True", ("tests/test_mcp.py",), "MCP over HTTP answers without its key"),
    # --- the precision standard, the packed runtime, auto ---
    Mutant("gate-batch-ignored", "laya/encoder/gate.py", "and batch_dp <= bounds.batch_dependence_max_dp)", ")",
           ("tests/test_precision_gates.py::test_batch_dependence_is_measured",),
           "an answer that moves with its batch company passes the gate"),
    Mutant("gate-one-plan", "laya/encoder/runtimes/packed.py", "FP32_LAYER_TIERS = (0, 1, 2)",
           "FP32_LAYER_TIERS = (0,)",
           ("tests/test_auto.py::test_the_gate_keeps_the_first_layer_in_fp32_where_that_passes",),
           "the gate gives up before keeping the first encoder layer in fp32"),
    Mutant("packed-batches-rows", "laya/encoder/batch.py",
           "        for i in range(self.size):\n            n, k = int(lengths[i]), int(counts[i])",
           "        if self.size > 1:\n            lengths = lengths * 0 + int(lengths.max())\n"
           "        for i in range(self.size):\n            n, k = int(lengths[i]), int(counts[i])",
           ("tests/test_auto.py::test_a_row_answers_the_same_alone_and_in_any_batch",),
           "a row in company is computed with its batch's padding"),
    Mutant("rownet-local-unmasked", "laya/encoder/runtimes/rownet.py",
           'masks["global" if is_global else "local"]', 'masks["global"]',
           ("tests/test_parity.py::test_against_reference[packed-fp32-modernbert]",),
           "local layers attend over the whole row"),
    Mutant("auto-ties-to-candidate", "laya/encoder/choice.py", "if ratios[label] < ratios[winner]:",
           "if ratios[label] <= ratios[winner]:",
           ("tests/test_auto_measures.py::test_a_candidate_wins_only_if_faster_than_torch_fp32",),
           "a tie goes to the candidate, not the reference"),
    Mutant("auto-exact-takes-bf16", "laya/encoder/choice.py",
           'if key not in seen and (not exact or c.options.get("precision", "fp32") in EXACT):',
           "if key not in seen:", ("tests/test_auto.py::test_the_rule_in_order",),
           "precision='fp32' still lets auto choose bf16"),
    # --- windows, routing, lenses, profiles, GGUF ---
    Mutant("windows-last-missed", "laya/encoder/windows.py", "        if i + size >= n_tokens:",
           "        if i + size >= n_tokens - 1:", ("tests/test_caller_golden.py",),
           "a long state's last window stops one token short"),
    Mutant("lens-settles-early", "laya/encoder/lens.py", "        at = i + 1\n    return at",
           "        at = i\n    return at",
           ("tests/test_eval.py",), "the lens names the layer before the one answers settle at"),
    Mutant("routing-english-default", "laya/routing/decision.py", "    return primary in ENGLISH_CODES",
           "    return True", ("tests/test_routing.py",), "every Latin-script state routed to the English model"),
    # --- llama.cpp's laya GGUF ---
    Mutant("gguf-bucket-names", "laya/encoder/export/laya_gguf.py", '"6-10": "6_10"', '"6-10": "6-10"',
           ("tests/test_gguf_mainline.py::test_stock_llama_cpp_serves_what_laya_writes",),
           "the 6-10 option temperature is written under a key llama.cpp never looks up"),
    Mutant("gguf-rebuilt-never-prepends", "laya/encoder/gguf_file.py",
           'tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")',
           'tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")',
           ("tests/test_gguf_mainline.py::test_a_file_without_lays_keys_answers_as_its_checkpoint",),
           "an mmBERT tokenizer rebuilt from a plain file tokenizes otherwise than llama.cpp"),
    Mutant("gguf-unclamped", "laya/encoder/export/laya_gguf.py", 'out[f"{qtype}.{BUCKET_SUFFIX[bucket]}"] = float(t)',
           'out[f"{qtype}.{BUCKET_SUFFIX[bucket]}"] = float(checkpoint.config.temperature_by_options.get(key, t))',
           ("tests/test_gguf_mainline.py::test_what_laya_writes_is_a_laya_decision_gguf",),
           "the bucket temperatures are written as stored, not clamped as upstream loads them"),
    Mutant("strict-keeps-extras", "laya/response.py",
           "        if strict:\n            return out\n        if self.answer_confidence",
           "        if self.answer_confidence", ("tests/test_strict.py",), "a strict answer still carries x_ fields"),
    Mutant("strict-error-count", "laya/api.py",
           'return {"detail": items} if strict else {"detail": items, "x_error_count": len(detail)}',
           'return {"detail": items, "x_error_count": len(detail)}', ("tests/test_strict.py",),
           "a strict 422 still carries x_error_count"),
    Mutant("models-no-provenance", "laya/server/routes.py",
           '"model_digest", "digests", "calibration", "gate", "upgrade")',
           '"calibration")', ("tests/test_provenance.py",),
           "/v1/models stops saying which artifacts answer"),
    Mutant("digest-header-off", "laya/server/routes.py",
           "        return {MODEL_DIGEST_HEADER: digest} if digest else None", "        return None",
           ("tests/test_provenance.py",), "an answer no longer names the artifact that gave it"),
    Mutant("orders-first-only", "laya/orders.py",
           "    probabilities = {key: sum((r.probabilities or {}).get(key, 0.0) for r in readings) / n",
           "    probabilities = {key: (readings[0].probabilities or {}).get(key, 0.0)", ("tests/test_orders.py",),
           "x_order reads every order and keeps the first"),
    Mutant("orders-reversed-is-given", "laya/orders.py", "        return [given, given[::-1]]",
           "        return [given, given]", ("tests/test_orders.py",), "both reads the given order twice"),
    Mutant("shortlist-kept-only", "laya/encoder/shortlist.py",
           "    probabilities = {key: float(given.get(key, 0.0)) for key in keys}",
           "    probabilities = {key: float(value) for key, value in given.items()}", ("tests/test_shortlist.py",),
           "a shortlisted answer lists only the kept options (the contract wants every option asked)"),
    Mutant("shortlist-query-bare", "laya/encoder/shortlist.py", '    return f"{said}\\n{body}"', "    return body",
           ("tests/test_shortlist.py",), "the shortlist's query leaves out the question's instructions"),
    Mutant("batch-token-budget-ignored", BATCHER,
           "while self.batching.has_room(rows, tokens):",
           "while rows < self.batching.max_rows:",
           ("tests/test_admission.py::test_a_batch_holds_a_token_budget_as_well_as_rows",),
           "--max-batch-tokens bounds nothing"),
    Mutant("hosted-name-unknown", "laya/server/routes.py",
           '        if name is not None and name.startswith(HOSTED_PREFIX + "jev-"):', "        if False:",
           ("tests/test_server.py::test_the_decisions_routes_answer_as_systemone_under_the_hosted_names",),
           "typesafe/jev-<version>, OpenRouter's name for the hosted model, is refused as unknown"),
    Mutant("swap-splits-a-batch", "laya/encoder/model.py", "out_logits, out_act = runtime.forward(batch)",
           "out_logits, out_act = self.runtime.forward(batch)",
           ("tests/test_upgrade.py::test_a_swap_waits_for_the_batch_in_flight",),
           "a runtime swapped in mid-request answers the rest of that request's rows"),
    Mutant("gate-no-headroom", "laya/encoder/gate.py", "HEADROOM = 0.6\n", "HEADROOM = 1.0\n",
           ("tests/test_gate_cases.py::test_the_gate_keeps_headroom_inside_the_envelope",),
           "the gate applies the whole envelope to its own rows, leaving no room for inputs it never saw"),
    Mutant("gate-text-only", "laya/encoder/gate_cases.py", "    out += _many_options(rng, row_words, fits)\n", "",
           ("tests/test_gate_cases.py::test_every_input_kind_is_among_the_gate_rows",),
           "the gate never reads a question with many options"),
    Mutant("upgrade-never-swaps", "laya/encoder/upgrade.py", "        swap(runtime, choice)\n", "",
           ("tests/test_upgrade.py::test_the_first_load_answers_at_once_and_swaps_in_the_pick",),
           "the background upgrade reports a swap that never happens"),
    Mutant("busy-rounds-trusted", "laya/encoder/bench.py",
           "        if max(before, after) > BUSY_RATIO * quickest:", "        if False:",
           ("tests/test_auto_measures.py::test_a_round_on_a_busy_machine_is_timed_again",),
           "auto trusts a timing taken while the machine was busy"),
    # --- issue 59: progress, not wall time, tells a hung engine; and what nothing checked before ---
    Mutant("hang-by-wall-time", REMOTE,
           "        if not link.watch.readable:  # no CPU time to read here: silence against the measured wall speed",
           "        if True:  # no CPU time to read here: silence against the measured wall speed",
           (f"{RECOVERY}::test_a_slow_engine_on_busy_cores_is_left_to_work_and_a_stopped_one_is_restarted",),
           "a slow engine on a busy machine is judged hung by wall time against an idle machine's speed"),
    Mutant("spin-unseen", PROGRESS, "            if spent > bound:", "            if False:",
           (f"{RECOVERY}::test_a_spinning_engine_is_restarted_and_a_replacement_as_slow_is_left_to_work",),
           "a process spending CPU past what its work needs, answering nothing, is never restarted"),
    Mutant("spin-restarts-in-a-loop", REMOTE, "                again = self._spun == link.generation - 1",
           "                again = False",
           (f"{RECOVERY}::test_a_spinning_engine_is_restarted_and_a_replacement_as_slow_is_left_to_work",),
           "a replacement as slow as the process it replaced is killed again (a restart loop)"),
    Mutant("idle-counts-as-silence", REMOTE,
           "            if not self.sent:  # idle until now: silence counts from here",
           "            if False:  # idle until now: silence counts from here",
           (f"{RECOVERY}::test_a_request_after_the_engine_idled_past_the_hang_bound_is_answered_without_a_restart",),
           "an engine idle past the hang bound is judged hung by the first request after"),
    Mutant("retry-wait-capped", REMOTE,
           "await self._restarted(max(0.0, self.policy.retry_wait_s if left is None else left))",
           "await self._restarted(max(0.0, min(self.policy.retry_wait_s, math.inf if left is None else left)))",
           (f"{RECOVERY}::test_a_request_caught_by_a_death_waits_for_a_slow_restart_up_to_its_deadline",),
           "a request caught by a death gives up at a fixed bound, before its deadline, while a slow restart loads"),
    Mutant("caught-requests-dropped", REMOTE,
           "await self._restarted(max(0.0, self.policy.retry_wait_s if left is None else left))",
           "await self._restarted(0.0)",
           (f"{RECOVERY}::test_an_engine_killed_under_load_on_busy_cores_loses_no_request",),
           "a request caught by a death is answered 503 at once, never run on the new process"),
    Mutant("batch-tokens-not-plumbed", "laya/server/state.py",
           "max_wait_ms=self.max_wait_ms, max_tokens=self.max_batch_tokens)",
           "max_wait_ms=self.max_wait_ms)",
           ("tests/test_engine_process.py::test_laya_serve_gives_its_engine_processes_the_batch_bounds_it_was_given",),
           "--max-batch-tokens never reaches the engine process, where laya serve batches"),
    Mutant("ray-batch-tokens-not-plumbed", "laya/server/ray_app.py",
           "                                  max_batch_tokens=options.server.max_batch_tokens))",
           "                                  ))",
           ("tests/test_ray_config.py::test_laya_serve_ray_gives_each_replica_the_batch_bounds_it_was_given",),
           "--max-batch-tokens never reaches a Ray replica's batcher"),
    Mutant("remote-token-budget-ignored", ENGINE_LOOP,
           "        while self.prepared and batching.has_room(rows, tokens):",
           "        while self.prepared and rows < batching.max_rows:",
           ("tests/test_engine_process.py::test_the_engine_process_holds_a_batch_to_max_batch_tokens",),
           "the engine process batches past --max-batch-tokens"),
    Mutant("key-prefix-passes", "laya/auth.py", "hmac.compare_digest(token.strip().encode(), api_key.encode())",
           "api_key.encode().startswith(token.strip().encode())", ("tests/test_keys.py",),
           "an empty Bearer token or a strict prefix of the key passes"),
    Mutant("gate-mean-move", "laya/encoder/gate.py", "return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))",
           "return max(float(np.mean(np.abs(x - y))) for x, y in zip(a, b))",
           (f"{GATES}::test_one_option_moving_past_the_bound_fails_though_the_mean_move_is_under_it",),
           "the drift bound holds the mean move of an answer's probabilities, not each one's"),
    Mutant("gate-batch-at-drift-bound", "laya/encoder/gate.py", "and batch_dp <= bounds.batch_dependence_max_dp)",
           "and batch_dp <= bounds.max_dp)",
           (f"{GATES}::test_a_batch_dependence_between_its_bound_and_the_drift_bound_fails",),
           "batch dependence held to the drift bound, not its own 0.01"),
    Mutant("packed-act-head-reduced", ROWNET,
           "        a = self.act\n"
           "        act = F.linear(F.gelu(F.linear(torch.cat([cls, feats], -1), a[0], a[1])), a[2], a[3])",
           "        a = [p.to(DTYPES[self.plan.attention]) for p in self.act]\n"
           "        act = F.linear(F.gelu(F.linear(torch.cat([cls, feats], -1).to(a[0].dtype), a[0], a[1])), a[2],"
           " a[3]).float()",
           (f"{AUTO}::test_the_packed_scorer_and_act_head_run_in_fp32_whatever_the_precision",),
           "the packed runtime's act head runs in the plan's reduced precision"),
    Mutant("packed-scorer-reduced", ROWNET,
           "        s = self.scorer\n"
           "        y = F.linear(self.head_norm(m, s[0], s[1]), s[2], s[3])",
           "        s = [p.to(DTYPES[self.plan.attention]) for p in self.scorer]\n"
           "        y = F.linear(self.head_norm(m.to(s[0].dtype), s[0], s[1]), s[2], s[3])",
           (f"{AUTO}::test_the_packed_scorer_and_act_head_run_in_fp32_whatever_the_precision",),
           "the packed runtime's scorer runs in the plan's reduced precision"),
    Mutant("bench-picks-forced", "laya/encoder/choice.py", "if not faithful(model) or model.choice is not None:",
           "if model.choice is not None:",
           (f"{AUTO}::test_bench_pick_stores_the_fastest_faithful_runtime_never_one_forced_past_its_gate",),
           "laya bench --pick stores a runtime forced past its failed gate"),
    Mutant("bench-picks-slowest", "laya/encoder/choice.py", "winner = max(speed, key=lambda label: speed[label])",
           "winner = min(speed, key=lambda label: speed[label])",
           (f"{AUTO}::test_bench_pick_stores_the_fastest_faithful_runtime_never_one_forced_past_its_gate",),
           "laya bench --pick stores the slowest faithful runtime"),
    Mutant("orders-confidence-carried", "laya/orders.py", "confidence=choice_confidence(values),",
           "confidence=readings[0].confidence,",
           ("tests/test_orders.py::test_an_averaged_answer_has_its_confidence_recomputed_from_the_averaged_probabilities",),
           "an order-averaged answer keeps the first order's confidence"),
    Mutant("shortlist-confidence-of-kept", "laya/encoder/shortlist.py",
           "confidence=choice_confidence(list(probabilities.values()))",
           "confidence=choice_confidence(list(given.values()))",
           ("tests/test_shortlist.py::test_a_shortlisted_answers_confidence_is_over_every_option_asked",),
           "a shortlisted answer's confidence is over the kept options only"),
    Mutant("digest-names-only", "laya/digests.py",
           'listing.update(f"{item.relative_to(path).as_posix()}\\t{sha256_of(item)}\\n".encode())',
           'listing.update(f"{item.relative_to(path).as_posix()}\\n".encode())', ("tests/test_digests.py",),
           "a folder's digest (a tokenizer's) names its files, not their content"),
    Mutant("redaction-list-shallow", "laya/redaction.py", "        return [redacted(v) for v in value]",
           "        return [redact(v) if isinstance(v, str) else v for v in value]",
           ("tests/test_redaction.py::test_a_pid_or_a_path_inside_a_dict_inside_a_list_is_redacted_too",),
           "a pid or a path inside a dict inside a list leaves the server"),
    Mutant("min-confidence-10-in-11", "laya/structured/gate.py", "'6-10' if k <= 10", "'6-10' if k < 10",
           ("tests/test_structured.py::test_a_choice_is_gated_by_the_bucket_of_its_option_count",),
           "a choice of exactly 10 options is gated by the 11+ bucket"),
]
# A fixed, fast subset CI runs on every submission (`--ci`); the full run is a command, its last result
# in docs/mutants.json.
CI = ("rows-no-cut", "admission-alone-shed", "body-gzip-uncapped", "temps-bucket-3-5", "schema-union-unchecked",
      "values-noul-strict", "plans-unbounded", "surrogate-state", "key-over-plain-http", "answer-uncapped",
      "health-shows-pids", "gate-batch-ignored", "auto-exact-takes-bf16", "key-prefix-passes", "gate-mean-move",
      "orders-confidence-carried", "shortlist-confidence-of-kept", "digest-names-only", "redaction-list-shallow",
      "min-confidence-10-in-11", "bench-picks-forced", "swap-splits-a-batch", "gate-no-headroom")
RECORD = ROOT / "docs" / "mutants.json"


def plant(copy: Path, mutant: Mutant) -> None:
    path = copy / mutant.file
    text = path.read_text(encoding="utf-8")
    count = text.count(mutant.original)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the snippet occurs {count} times in {mutant.file}; update the mutant")
    path.write_text(text.replace(mutant.original, mutant.mutated), encoding="utf-8")


def run_tests(copy: Path, tests: tuple[str, ...], stop: bool = True, root: Path = ROOT) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH")) if p)}
    # run from the copy: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH
    where = "import laya, laya.encoder.export; print(laya.__file__, laya.encoder.export.__file__)"
    probe = subprocess.run([sys.executable, "-c", where], env=env, cwd=copy, capture_output=True, text=True,
                           check=True)
    if not all(path.startswith(str(copy)) for path in probe.stdout.split()):
        raise SystemExit(f"the copy is not the laya imported ({probe.stdout.strip()})")
    started = time.perf_counter()
    try:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(["-x"] if stop else []),
                   *(str(root / t) for t in tests)]
        done = subprocess.run(command,
                              env=env, cwd=copy, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - started, "timeout"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    failed = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    failed = [f[f.find("tests/"):] if "tests/" in f else f for f in failed]  # pytest names them from the copy
    tail = lines[-1:] or [done.stderr.strip()[-200:]]
    return done.returncode, time.perf_counter() - started, tail[0] + "".join(f"\n{'':40}red: {f}" for f in failed)


def fresh_copy(base: Path, name: str) -> Path:
    copy = base / name
    shutil.copytree(ROOT / "laya", copy / "laya", ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (fnmatch patterns); default: all")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--all-red", action="store_true", help="run every named test (no -x): list all that fail")
    parser.add_argument("--tests", nargs="+", metavar="NODE", help="run these tests for every chosen mutant instead")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the folder the test paths are read from (e.g. a copy holding older tests); default: here")
    parser.add_argument("--ci", action="store_true", help="the fixed fast subset CI runs (no baseline)")
    parser.add_argument("--record", action="store_true", help=f"write the verdicts to {RECORD.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.ci:
        args.names, args.no_baseline = list(CI), True
    chosen = [m for m in MUTANTS if not args.names or any(fnmatch.fnmatch(m.name, p) for p in args.names)]
    if args.list or not chosen:
        for m in chosen or MUTANTS:
            print(f"{m.name:28} {m.file:34} {m.what}\n{'':28} tests: {' '.join(m.tests)}")
        return 0 if chosen else 2
    survived = 0
    verdicts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="laya-mutants-") as tmp:
        if not args.no_baseline:
            tests = tuple(args.tests or dict.fromkeys(t for m in chosen for t in m.tests))
            code, seconds, tail = run_tests(fresh_copy(Path(tmp), "baseline"), tests, root=args.root)
            print(f"{'baseline':28} {'green' if code == 0 else 'RED':9} {seconds:6.1f}s  {tail}", flush=True)
            if code != 0:
                print("the baseline fails: fix the tests before reading the mutants")
                return 1
        for m in chosen:
            copy = fresh_copy(Path(tmp), m.name)
            plant(copy, m)
            code, seconds, tail = run_tests(copy, tuple(args.tests or m.tests), stop=not args.all_red, root=args.root)
            # a timeout is no catch: a mutant that makes a test hang is a bug the suite does not name
            verdict = "caught" if code == 1 else "timeout" if code == -1 else "survived" if code == 0 \
                else f"error({code})"
            survived += verdict != "caught"
            verdicts[m.name] = verdict
            print(f"{m.name:28} {verdict:9} {seconds:6.1f}s  {tail}", flush=True)
            shutil.rmtree(copy)
    print(f"{len(chosen) - survived} of {len(chosen)} mutants caught")
    if args.record:
        record = {"command": "python scripts/mutants.py --record", "date": time.strftime("%Y-%m-%d"),
                  "caught": len(chosen) - survived, "mutants": len(chosen), "verdicts": verdicts}
        RECORD.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
