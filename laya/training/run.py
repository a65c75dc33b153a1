"""`laya train` / `laya.train`: fine-tune a checkpoint on labelled decisions and write a checkpoint in the
exact published format, with refitted temperatures and an act head that predicts when the decision is
wrong, at least as well as the top probability it reads (`laya.training.act`).

The lines are split (seeded, by line) into a training part and a held-out part; the held-out part is
split again: one half fits the act head and the temperatures, the other half only measures (before
and after), so every reported figure is on answers nothing was fitted on.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laya.calibration.abstention import choose_threshold
from laya.calibration.data import Record, read_labelled
from laya.calibration.file import Calibration
from laya.calibration.fitting import fit_temperatures
from laya.calibration.metrics import auroc, coverage_curve
from laya.calibration.run import collect, decode_all, measure, split, top_and_correct
from laya.calibration.temperatures import bucket_key
from laya.encoder.checkpoint import CONFIG_FILE, WEIGHTS_FILE, Checkpoint, load_checkpoint
from laya.errors import CheckpointError, LayaError
from laya.training.examples import examples_of

MIN_HELDOUT = 100  # held-out answers below which figures mean little
EPOCHS_DIR = "epochs"
REPORT_DIR = "report"
FP32_TENSORS = ("act_head.",)  # kept fp32 in the saved file: the folded standardisation needs the range


class TrainingError(LayaError):
    """Training cannot go on as asked (bad settings, an unusable split, a diverging loss)."""


def _answers(model: Any, records: Sequence[Record]) -> list[Any]:
    """Every labelled answer of `records`, read by `model` (calibration's evidence)."""
    return [s for per_line in collect(model, records) for s in per_line]


def _records_at(records: Sequence[Record], idx: Sequence[int]) -> list[Record]:
    return [records[i] for i in idx]


def save_checkpoint(net: Any, source: Checkpoint, out: Path, config_updates: dict[str, Any]) -> None:
    """The published file set: weights (fp16 as published, the act head fp32), the source's configs with
    `config_updates`, its encoder config and tokenizer."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in net.state_dict().items():
        array = value.detach().float().cpu().numpy()
        tensors[name] = array if name.startswith(FP32_TENSORS) else array.astype(np.float16)
    tmp = out / (WEIGHTS_FILE + ".partial")
    save_file(tensors, str(tmp))
    os.replace(tmp, out / WEIGHTS_FILE)
    config = json.loads((source.path / CONFIG_FILE).read_text(encoding="utf-8"))
    config.update(config_updates)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for folder in ("encoder", "tokenizer"):
        if (out / folder).exists():
            shutil.rmtree(out / folder)
        shutil.copytree(source.path / folder, out / folder)


def _load(folder: Path) -> Any:
    from laya.encoder.model import Model
    from laya.encoder.runtimes.pytorch import TorchRuntime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the source's own clamp was reported at the start
        checkpoint = load_checkpoint(folder, source=str(folder))
        return Model(checkpoint, TorchRuntime(checkpoint))


def _progress(total_steps: int, start_step: int, quiet: bool):
    if quiet:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)


def train(model: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, *, settings: Any = None,
          resume: bool = False, text_column: str = "text", label_column: str = "label",
          target_precision: float = 0.9, quiet: bool = False, plots: bool = True) -> dict[str, Any]:
    """Fine-tune `model` on `data` (JSONL or CSV) into `out`; returns the report (also in out/report/)."""
    import torch

    from laya.training.loop import Settings

    settings = settings or Settings()
    settings.check()
    threads_before = torch.get_num_threads()
    if settings.threads:  # for this run only: the caller's (or test session's) own count comes back after
        torch.set_num_threads(int(settings.threads))
    try:
        return _train(model, data, out, settings, resume, text_column, label_column, target_precision, quiet,
                      plots)
    finally:
        torch.set_num_threads(threads_before)


@dataclass
class _Parts:
    """The labelled lines, split: training, fitting (act head and temperatures) and measuring."""

    records: list[Any]
    train: list[Any]
    fit: list[Any]
    report: list[Any]


def _train(model: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, settings: Any, resume: bool,
           text_column: str, label_column: str, target_precision: float, quiet: bool, plots: bool
           ) -> dict[str, Any]:
    from laya.encoder.loading import load_model_checkpoint
    from laya.encoder.runtimes.pytorch import TorchRuntime

    out = Path(out)
    warnings_list: list[str] = []

    def warn(message: str) -> None:
        warnings_list.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    records = read_labelled(data, text_column=text_column, label_column=label_column) \
        if str(data).lower().endswith(".csv") else read_labelled(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source, _, kind = load_model_checkpoint(model)
    if kind is not None:
        raise CheckpointError(f"{model} is a {kind} bundle; fine-tune the checkpoint it was exported from")
    parts = _split(records, settings, source, warn)
    base = _load(source.path)
    before = measure(_answers(base, parts.report), base.temperatures, 10)
    net = TorchRuntime(source).net
    trainer = _epochs(net, source, parts, settings, out / EPOCHS_DIR, resume, quiet)
    act_record, net = _fitted_act_head(net, source, out, parts, settings.seed, warn)
    trained, temps, thresholds, fit_evidence = _fitted_temperatures(net, source, out, parts, target_precision)
    answers = _answers(trained, parts.report)
    after = measure(answers, temps, 10)
    _warn_if_collapsed(answers, temps, after, warn)
    top, correct = top_and_correct(answers, temps)
    act = np.array([s.evidence.act_probability for s in answers], dtype=float)
    report = _report(data, model, parts, settings, trainer, before, after, answers, temps, target_precision,
                     thresholds, warnings_list)
    report["act_head"] = act_record | {"auroc": auroc(act, correct), "auroc_top_probability": auroc(top, correct),
                                       "auroc_top_probability_untempered": auroc(_read_top1(answers), correct)}
    report["act_head"]["coverage_curve"] = _curve(act, correct)
    save_checkpoint(net, source, out, {
        "fine_tuned": True, **temps.to_dict(),
        "training": {"laya_train": asdict(settings), "train_report": _short(report),
                     "abstention_thresholds": thresholds, "act_head": act_record | {
                         "auroc": report["act_head"]["auroc"],
                         "auroc_top_probability": report["act_head"]["auroc_top_probability"],
                         "auroc_top_probability_untempered":
                             report["act_head"]["auroc_top_probability_untempered"]}},
    })
    _write_report(out / REPORT_DIR, report, trainer.history, act, top, correct, plots)
    for w in caught:  # the source checkpoint's own warnings (e.g. a clamped temperature), once, at the end
        warnings.warn(str(w.message), w.category, stacklevel=2)
    return report


def _split(records: list[Any], settings: Any, source: Any, warn: Callable[[str], None]) -> _Parts:
    """Training lines, and the held-out ones halved: one half fits the act head and the temperatures,
    the other measures (so no figure is read on what fitted it)."""
    from laya.training.examples import check_rows

    try:
        train_idx, held_idx = split(len(records), settings.holdout, settings.seed)
        fit_pos, report_pos = split(len(held_idx), 0.5, settings.seed + 1) if len(held_idx) >= 2 else ([], [])
    except ValueError:
        train_idx, held_idx, fit_pos, report_pos = [], [], [], []
    parts = _Parts(records, _records_at(records, train_idx), [records[held_idx[i]] for i in fit_pos],
                   [records[held_idx[i]] for i in report_pos])
    fit_examples, report_examples = examples_of(parts.fit), examples_of(parts.report)
    if not examples_of(parts.train) or not fit_examples or not report_examples:
        raise TrainingError(f"{len(records)} labelled lines cannot be split into training, fitting and measuring "
                            "parts with answers in each; label more lines (or change --holdout)")
    check_rows(source, examples_of(records))
    heldout_answers = len(fit_examples) + len(report_examples)
    if heldout_answers < MIN_HELDOUT:
        warn(f"the held-out part holds only {heldout_answers} answers (fewer than {MIN_HELDOUT}): its accuracy, "
             "calibration and act-head figures mean little; label more data")
    return parts


def _epochs(net: Any, source: Any, parts: _Parts, settings: Any, epochs_dir: Path, resume: bool,
            quiet: bool) -> Any:
    """Train for the settings' epochs (from the last saved one with `resume`), saving each epoch's
    checkpoint and trainer state; the network ends on the CPU."""
    from laya.training.loop import Trainer

    train_examples = examples_of(parts.train)
    steps_per_epoch = -(-len(train_examples) // settings.batch_size)
    trainer = Trainer(net, source, settings, steps_per_epoch * settings.epochs)
    if resume:
        done = sorted((int(p.name.split("-")[1]), p) for p in epochs_dir.glob("epoch-*")
                      if (p / "trainer_state.pt").exists())
        if not done:
            raise TrainingError(f"--resume: no epoch checkpoint under {epochs_dir}")
        state = trainer.load_state(done[-1][1])
        if state.get("settings") != asdict(settings) or state.get("data_lines") != len(parts.records):
            raise TrainingError(f"--resume: {done[-1][1]} was trained with other settings or data "
                                f"({state.get('settings')}); resume with the same ones")
        net.load_state_dict(state["weights"])
        net.to(trainer.device)
    bar = _progress(steps_per_epoch * settings.epochs, trainer.history.steps, quiet)
    settings_record = asdict(settings)
    while trainer.history.epochs_done < settings.epochs:
        epoch = trainer.history.epochs_done + 1

        def on_step(step: int, n: int, loss: float, epoch: int = epoch) -> None:
            if bar is not None:
                bar.set_description(f"epoch {epoch}/{settings.epochs}")
                bar.set_postfix(loss=f"{loss:.4f}")
                bar.update(1)

        trainer.epoch(train_examples, on_step)
        folder = epochs_dir / f"epoch-{epoch}"
        save_checkpoint(net, source, folder, {"fine_tuned": True, "training": {"laya_train": settings_record,
                                                                              "epoch": epoch}})
        trainer.save_state(folder, {"settings": settings_record, "data_lines": len(parts.records),
                                    "weights": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}})
    if bar is not None:
        bar.close()
    net.to("cpu")
    return trainer


def _fitted_act_head(net: Any, source: Any, out: Path, parts: _Parts, seed: int,
                     warn: Callable[[str], None]) -> tuple[dict[str, Any], Any]:
    """The act head, on the fitting half of the held-out lines, decision network frozen and read as
    it is saved and served (fp16 weights): its record, and the network as saved."""
    from laya.training.act import fit_act_head, read_inputs

    fit_examples = examples_of(parts.fit)
    save_checkpoint(net, source, out, {})
    net = _load(out).runtime.net
    x, right = read_inputs(net, source, fit_examples)
    act_record = fit_act_head(net, x, right, seed)
    act_record["fitted_on"] = f"{len(fit_examples)} held-out answers ({len(parts.fit)} lines), decision frozen"
    if not act_record["fitted"]:
        warn(f"act head not fitted (it reads the top probability): {act_record['why_not']}")
    return act_record, net


def _fitted_temperatures(net: Any, source: Any, out: Path, parts: _Parts, target_precision: float
                         ) -> tuple[Any, Any, dict[str, float], list[Any]]:
    """Temperatures and abstention thresholds per bucket, on the fitting half, with the weights as
    saved (fp16): the model that carries them, the temperatures, the thresholds and the evidence."""
    save_checkpoint(net, source, out, {})
    trained = _load(out)
    fit_evidence = _answers(trained, parts.fit)
    fitted = fit_temperatures(fit_evidence)
    temps = Calibration(model="", temperature=dict(fitted.per_type),
                        temperature_by_options=dict(fitted.by_bucket)).over(trained.temperatures)
    trained.temperatures = temps
    fit_top, fit_correct = top_and_correct(fit_evidence, temps)
    thresholds = {}
    for key in sorted({bucket_key(s.evidence.qtype, s.evidence.n_options) for s in fit_evidence}):
        idx = [i for i, s in enumerate(fit_evidence) if bucket_key(s.evidence.qtype, s.evidence.n_options) == key]
        value = choose_threshold(fit_top[idx], fit_correct[idx], target_precision)
        if value is not None:
            thresholds[key] = round(float(value), 6)
    return trained, temps, thresholds, fit_evidence


def _warn_if_collapsed(answers: Sequence[Any], temps: Any, after: dict[str, Any],
                       warn: Callable[[str], None]) -> None:
    predicted = np.array([int(np.argmax(p)) for p in decode_all(answers, temps)])
    labels = np.array([s.label for s in answers])
    majority = float(np.bincount(labels).max() / len(labels))
    top_share = float(np.bincount(predicted).max() / len(predicted))
    if top_share >= 0.95 and majority < 0.9 or after["overall"]["accuracy"] <= majority + 0.01:
        warn(f"predictions collapse to the class prior: one answer is {top_share:.0%} of the held-out predictions "
             f"and accuracy {after['overall']['accuracy']:.1%} is no better than always answering the most common "
             f"label ({majority:.1%}); try more epochs, higher learning rates, more data or another seed")


def _report(data: Any, model: Any, parts: _Parts, settings: Any, trainer: Any, before: dict[str, Any],
            after: dict[str, Any], answers: Sequence[Any], temps: Any, target_precision: float,
            thresholds: dict[str, float], warnings_list: list[str]) -> dict[str, Any]:
    history = trainer.history
    return {
        "data": os.fspath(data), "model": os.fspath(model),
        "split": {"seed": settings.seed, "holdout": settings.holdout, "train_lines": len(parts.train),
                  "fit_lines": len(parts.fit), "report_lines": len(parts.report),
                  "train_answers": len(examples_of(parts.train)), "fit_answers": len(examples_of(parts.fit)),
                  "report_answers": len(answers)},
        "settings": asdict(settings), "device": str(trainer.device),
        "autocast": str(trainer.dtype).replace("torch.", "") if trainer.dtype else "fp32",
        "training": {"epochs": history.epochs_done, "steps": history.steps, "epoch_losses": history.epoch_losses,
                     "seconds": round(history.seconds, 2),
                     "examples_per_second": round(history.examples_seen / history.seconds, 2) if history.seconds
                     else None},
        "heldout": {"before": before["overall"], "after": after["overall"], "before_groups": before["groups"],
                    "after_groups": after["groups"]},
        "act_head": {},
        "temperatures": temps.to_dict(),
        "abstention_thresholds": {"target_precision": target_precision, "by_bucket": thresholds},
        "warnings": warnings_list,
    }


def _read_top1(answers: Sequence[Any]) -> np.ndarray:
    """The untempered top probability as the act head reads it, from the final row's logits in fp32:
    top1 (its input column -4), or where every answer has two options minus the normalised entropy,
    the same order resolved where fp32 top1 rounds to 1.0 (`laya.training.act.plain_signal`). Its
    top-probability fallback ranks answers exactly by this; the served top probability is tempered,
    which for three or more options is not a monotone function of it."""
    import torch

    from laya.encoder.runtimes.pytorch import act_features
    from laya.training.act import plain_signal

    features = np.array([act_features(torch.tensor(s.evidence.readouts[-1][1], dtype=torch.float32)).double().numpy()
                         for s in answers]).reshape(len(answers), 4)
    return plain_signal(features)[1]


def _curve(score: np.ndarray, correct: np.ndarray, points: int = 21) -> list[dict[str, float]]:
    """Precision of the answers kept when answering only the top `coverage` share by `score`."""
    cov, prec, _ = coverage_curve(score, correct)
    out = []
    for c in np.linspace(1 / points, 1.0, points):
        i = min(len(cov) - 1, int(np.searchsorted(cov, c)))
        out.append({"coverage": round(float(cov[i]), 4), "precision": round(float(prec[i]), 4)})
    return out


def _short(report: dict[str, Any]) -> dict[str, Any]:
    b, a = report["heldout"]["before"], report["heldout"]["after"]
    return {"split": report["split"], "before": {k: b[k] for k in ("n", "accuracy", "nll", "ece")},
            "after": {k: a[k] for k in ("n", "accuracy", "nll", "ece")},
            "act_auroc": report["act_head"]["auroc"],
            "top_probability_auroc": report["act_head"]["auroc_top_probability"],
            "warnings": report["warnings"]}


def _write_report(folder: Path, report: dict[str, Any], history: Any, act: np.ndarray, top: np.ndarray,
                  correct: np.ndarray, plots: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (folder / "summary.txt").write_text(summary(report) + "\n", encoding="utf-8")
    if plots:
        from laya.training.plots import act_coverage_plot, loss_plot

        loss_plot(history.losses, history.epoch_losses, folder / "loss.png")
        act_coverage_plot(act, top, correct, folder / "act_coverage.png")


def summary(report: dict[str, Any]) -> str:
    s, t = report["split"], report["training"]
    lines = [f"trained {t['epochs']} epochs, {t['steps']} steps in {t['seconds']:.0f} s "
             f"({t['examples_per_second']} examples/s) on {report['device']} ({report['autocast']}); "
             f"{s['train_answers']} training answers, {s['fit_answers']} for the act head and temperatures, "
             f"{s['report_answers']} measured"]
    b, a = report["heldout"]["before"], report["heldout"]["after"]
    lines.append(f"{'group':12s} {'n':>6s}  {'accuracy':>17s}  {'NLL':>15s}  {'ECE':>15s}")
    lines.append(f"{'overall':12s} {a['n']:6d}  {b['accuracy']:.4f} -> {a['accuracy']:.4f}  "
                 f"{b['nll']:.4f} -> {a['nll']:.4f}  {b['ece']:.4f} -> {a['ece']:.4f}")
    for key, g in report["heldout"]["after_groups"].items():
        f = report["heldout"]["before_groups"].get(key, g)
        lines.append(f"{key:12s} {g['n']:6d}  {f['accuracy']:.4f} -> {g['accuracy']:.4f}  "
                     f"{f['nll']:.4f} -> {g['nll']:.4f}  {f['ece']:.4f} -> {g['ece']:.4f}")
    act = report["act_head"]
    if act.get("auroc") is not None:
        lines.append(f"right vs wrong AUROC: act probability {act['auroc']:.3f}, top probability "
                     f"{act['auroc_top_probability']:.3f} ({act.get('auroc_top_probability_untempered', 0.0):.3f} "
                     "untempered)" + ("" if act["fitted"] else " (act head not fitted)"))
    if act.get("says"):
        lines.append(act["says"])
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


__all__ = ["TrainingError", "save_checkpoint", "summary", "train"]
