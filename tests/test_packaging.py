"""The package as users get it: the sdist and the wheel built from it (as `python -m build` does), and
that wheel installed, not editable, into a fresh virtual environment outside the checkout.

Nothing here imports laya from the checkout: every command runs in the fresh environment, from a
folder outside the repository, with no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest
from live_server import free_port, wait_ready
from parity_targets import bound_of  # each precision's bound against the reference (the test's own figures)

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = "torch,onnx,export,serve,llama,ray"


def tracked_package_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "laya"], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> dict[str, Path]:
    """An sdist and the wheel built from it, from a copy of the tracked files (what a clone holds)."""
    src = tmp_path_factory.mktemp("clone") / "laya-runtime"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    for rel in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_holds_every_package_and_data_file(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = [rel for rel in tracked_package_files() if rel not in names]
    assert not missing, f"tracked files missing from the wheel: {missing}"
    # what once went missing: the server, the decide engine, the demo page, the generators' data
    for path in ("laya/server/app.py", "laya/decide/llama.py", "laya/server/static/index.html",
                 "laya/testing/corpus.txt", "laya/py.typed", "laya/encoder/export/onnx.py"):
        assert path in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_sdist_holds_every_package_and_data_file(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = [rel for rel in tracked_package_files() if rel not in names]
    assert not missing, f"tracked files missing from the sdist: {missing}"
    assert {"pyproject.toml", "README.md"} <= names


def _env() -> dict[str, str]:
    # LAYA_AUTO_MEASURE too: the installed wheel's auto measures at first load, as a user's does
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "RAY_ADDRESS", "LAYA_AUTO_MEASURE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return env


def _setup_llama_wheel() -> list[list[str]]:
    """The llama-cpp-python wheel scripts/setup.sh built and installed in the project's venv (its CPU
    variants and scripts/llama-modern-bert.patch), installed first as setup installs it; none elsewhere."""
    import sysconfig

    marker = Path(sysconfig.get_paths()["platlib"]) / "llama_cpp" / "lib" / "laya-build"
    if not marker.is_file():
        return []
    cache = Path(os.environ.get("LAYA_WHEELS") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "laya" / "wheels")
    found = sorted((cache / f"llama-cpp-python-{marker.read_text().strip()}").glob("llama_cpp_python-*.whl"))
    return [[str(found[0])]] if found else []


@pytest.fixture(scope="session")
def fresh_env(dists, tmp_path_factory) -> Path:
    """A virtual environment made by the interpreter the project's venv came from, with the wheel and
    its extras installed by pip as a user would (torch pinned to the CPU build first, as setup does)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    subprocess.run([base, "-m", "venv", str(venv)], check=True, env=_env())
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in (["torch==2.13.0"], *_setup_llama_wheel(), [f"{dists['wheel']}[{EXTRAS}]"]):
        done = subprocess.run(pip + args, capture_output=True, text=True, timeout=1800, env=_env(),
                              cwd=venv.parent)
        assert done.returncode == 0, done.stderr[-4000:]
    return venv


def run(venv: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=cwd)


@pytest.mark.slow
def test_the_installed_wheel_runs_every_command(fresh_env, tmp_path):
    venv, work = fresh_env, tmp_path
    where = run(venv, "python", "-c", "import laya, laya.server.app, laya.decide.llama, laya.encoder.export.onnx; "
                                      "print(laya.__file__)", cwd=work)
    assert where.returncode == 0, where.stderr
    location = Path(where.stdout.strip()).resolve()
    assert location.is_relative_to(venv.resolve()) and not location.is_relative_to(ROOT)
    assert run(venv, "laya", "--help", cwd=work).returncode == 0

    made = run(venv, "python", "-m", "laya.testing.checkpoints", "ck", cwd=work)
    assert made.returncode == 0, made.stderr
    info = run(venv, "laya", "info", "ck", "--json", cwd=work)
    assert info.returncode == 0, info.stderr
    chosen = json.loads(info.stdout)  # what auto runs here: the fastest faithful runtime it timed at this load
    assert chosen["runtime_choice"], "`laya info` without -r runs auto, which says what it chose"
    questions = json.dumps({"t": {"type": "choice", "instructions": "Team?",
                                  "criteria": {"billing": "refunds", "sales": None}}})

    def predicted(model: str, *args: str) -> dict[str, float]:
        answer = run(venv, "laya", "predict", "-m", model, *args, "-s", "refund please", "-q", questions, cwd=work)
        assert answer.returncode == 0, answer.stderr
        return json.loads(answer.stdout)["answers"]["t"]["probabilities"]

    def max_dp(got: dict[str, float], want: dict[str, float]) -> float:
        assert list(got) == list(want)
        return max(abs(got[k] - want[k]) for k in want)

    # Each runtime against the reference (torch fp32, named: never auto) at its own precision's bound.
    reference = predicted("ck", "-r", "torch")
    auto, bound = predicted("ck"), bound_of(chosen["precision"])
    dp = max_dp(auto, reference)
    assert dp <= bound, (f"auto chose {chosen['runtime']} {chosen['precision']} "
                         f"({chosen['runtime_choice']['reason']}): max |dp| {dp:.2e} > its bound {bound:g}")
    exported = run(venv, "laya", "export", "onnx", "ck", "ck-onnx", cwd=work, timeout=600)
    assert exported.returncode == 0, exported.stderr
    dp = max_dp(predicted("ck-onnx"), reference)  # an fp32 bundle runs on ONNX Runtime fp32
    assert dp <= bound_of("fp32"), f"onnx fp32 bundle: max |dp| {dp:.2e} > {bound_of('fp32'):g}"
    exported = run(venv, "laya", "export", "gguf", "ck", "ck.gguf", "--type", "f32", cwd=work, timeout=600)
    assert exported.returncode == 0, exported.stderr
    dp = max_dp(predicted("ck.gguf"), reference)  # one laya GGUF, run on llama.cpp with the head in numpy
    assert dp <= bound_of("f32"), f"llama f32 GGUF: max |dp| {dp:.2e} > {bound_of('f32'):g}"


@pytest.mark.slow
@pytest.mark.parametrize("how", [[], ["--ray"]], ids=["uvicorn", "ray-serve"])
def test_the_installed_wheel_serves_both_engines(fresh_env, tmp_path, how):
    """`laya serve`, and `laya serve --ray` (a local Ray cluster, each model a deployment)."""
    venv, work = fresh_env, tmp_path
    assert run(venv, "python", "-m", "laya.testing.checkpoints", "ck", cwd=work).returncode == 0
    gguf = run(venv, "python", "-c", "from laya.server.serve import smollm2_gguf; print(smollm2_gguf())", cwd=work)
    assert gguf.returncode == 0 and gguf.stdout.strip().endswith(".gguf"), gguf.stdout + gguf.stderr
    port = free_port()
    clusters_before = _gcs_servers()
    log = (work / "serve-stderr.txt").open("w")  # a file, not a pipe: Ray forwards every replica's log lines
    server = subprocess.Popen([str(venv / "bin" / "laya"), "serve", "-m", "enc=ck", "-m",
                               f"chat={gguf.stdout.strip()}", "--port", str(port), *how],
                              cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        question = {"u": {"type": "choice", "instructions": "Which team?",
                          "criteria": {"billing": "payments", "support": "bugs"}}}
        for name in ("enc", "chat"):
            r = httpx.post(url + "/v1/systemone", json={"model": name, "state": "refund my payment",
                                                         "questions": question}, timeout=60)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model"] == name and set(body["answers"]["u"]["probabilities"]) == {"billing", "support"}
        page = httpx.get(url + "/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()  # the demo page ships in the wheel
        if how:
            assert httpx.get(url + "/health", timeout=10).json()["models"]["enc"]["ray"]["deployment"] == "enc"
    except BaseException:
        print((work / "serve-stderr.txt").read_text()[-4000:])
        raise
    finally:
        server.terminate()
        code = server.wait(timeout=60)
        log.close()
    if how:  # it stopped cleanly, and the local cluster it started went with it
        assert code == 0, (work / "serve-stderr.txt").read_text()[-3000:]
        assert _gcs_servers() <= clusters_before


def _gcs_servers() -> set[str]:
    """Pids of running Ray clusters' GCS servers."""
    ps = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True).stdout.split("\n")
    return {line.split()[0] for line in ps if line.strip().endswith("gcs_server")}
