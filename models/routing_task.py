"""A synthetic, learnable routing task for fine-tuning tests and benchmarks (deterministic).

A support message in English, Spanish, French or German goes to the team whose keyword family it
mentions. Labels carry 10% noise overall, the way real labels do: not uniformly, but from one
sloppy annotator (by default the German messages, 40% of whose labels are another team's). A model
trained on it can be right about 90% of the time; which answers are likely wrong is learnable from
the input (the language), which is what an act head trained for correctness should pick up.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

TEAMS = ("billing", "technical", "sales", "legal")
DESCRIPTIONS = {"billing": "payments, invoices and refunds", "technical": "bugs, crashes and access problems",
                "sales": "new plans, prices and upgrades", "legal": "contracts, privacy and complaints"}
KEYWORDS = {
    "en": {"billing": ["refund", "invoice", "charged twice"], "technical": ["crash", "error message", "cannot log in"],
           "sales": ["upgrade", "pricing", "new plan"], "legal": ["contract", "privacy", "lawyer"]},
    "es": {"billing": ["reembolso", "factura", "cobro doble"],
           "technical": ["fallo", "mensaje de error", "no puedo entrar"],
           "sales": ["mejorar el plan", "precios", "plan nuevo"], "legal": ["contrato", "privacidad", "abogado"]},
    "fr": {"billing": ["remboursement", "facture", "débité deux fois"], "technical": ["plantage", "message d'erreur",
                                                                                 "impossible de me connecter"],
           "sales": ["changer d'offre", "tarifs", "nouvel abonnement"], "legal": ["contrat", "confidentialité",
                                                                                 "avocat"]},
    "de": {"billing": ["Rückerstattung", "Rechnung", "doppelt abgebucht"], "technical": ["Absturz", "Fehlermeldung",
                                                                                      "kann mich nicht anmelden"],
           "sales": ["Tarifwechsel", "Preise", "neuer Tarif"], "legal": ["Vertrag", "Datenschutz", "Anwalt"]},
}
FILLER = {
    "en": "hello please my account today thanks again the team order yesterday help soon",
    "es": "hola por favor mi cuenta hoy gracias otra vez el equipo pedido ayer ayuda pronto",
    "fr": "bonjour merci mon compte aujourd'hui encore l'équipe commande hier aide bientôt svp",
    "de": "hallo bitte mein Konto heute danke nochmal das Team Bestellung gestern Hilfe bald",
}
# Each option's description names its keyword family, in every language, the way a routing prompt
# lists what belongs to each team: the model learns to match the message against the options.
QUESTION = {"team": {"type": "choice", "instructions": "Which team should handle this message?",
                     "criteria": {team: ", ".join(KEYWORDS[lang][team][0] for lang in sorted(KEYWORDS))
                                  for team in TEAMS}}}


def routing_lines(n: int, seed: int = 0, noisy_language: str = "de",
                  noisy_share: float = 0.4) -> list[dict[str, Any]]:
    """`n` labelled lines in `laya calibrate` / `laya train` JSONL form, each with its true team, language
    and whether its label was flipped, for analysis (`write_jsonl` leaves those out)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lang = rng.choice(sorted(KEYWORDS))
        team = rng.choice(TEAMS)
        words = [rng.choice(FILLER[lang].split()) for _ in range(rng.randint(4, 12))]
        words.insert(rng.randint(0, len(words)), KEYWORDS[lang][team][0])
        label, flipped = team, False
        if lang == noisy_language and rng.random() < noisy_share:
            label, flipped = rng.choice([t for t in TEAMS if t != team]), True
        out.append({"state": " ".join(words), "questions": QUESTION, "labels": {"team": label},
                    "team": team, "language": lang, "flipped": flipped})
    return out


def write_jsonl(path: str | Path, lines: list[dict[str, Any]]) -> Path:
    keep = ("state", "questions", "labels")
    Path(path).write_text("".join(json.dumps({k: line[k] for k in keep}, ensure_ascii=False) + "\n"
                                  for line in lines), encoding="utf-8")
    return Path(path)


def write_csv(path: str | Path, lines: list[dict[str, Any]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for line in lines:
            writer.writerow([line["state"], line["labels"]["team"]])
    return Path(path)
