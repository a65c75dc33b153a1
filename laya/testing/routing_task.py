"""A synthetic, learnable routing task for fine-tuning tests and benchmarks (deterministic).

A support message in English, Spanish, French or German goes to the team whose keyword family it
mentions. Labels carry 10% noise overall, the way real labels do: not uniformly, but from one
sloppy annotator (by default the German messages, 40% of whose labels are another team's). A model
trained on it can be right about 90% of the time; which answers are likely wrong is learnable from
the input (the language), which is what an act head trained for correctness should pick up.

Two variants test the act head on shapes it was not tuned on: `uniform_noise_lines` (six languages,
10% of the labels another team's at random: nothing about which answers are wrong is learnable
beyond the model's own confidence) and `app_footer_lines` (a yes/no question; the messages sent from
the mobile app, marked by a footer, carry 40% label noise while the keyword that decides the answer
is as clear as anywhere, so the model's confidence there is misleading).
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
    "it": {"billing": ["rimborso", "fattura", "addebito doppio"],
           "technical": ["arresto anomalo", "messaggio di errore", "non riesco ad accedere"],
           "sales": ["cambio piano", "listino prezzi", "nuovo abbonamento"],
           "legal": ["contratto", "riservatezza", "avvocato"]},
    "pt": {"billing": ["estorno", "fatura", "cobrança dupla"],
           "technical": ["falha", "mensagem de erro", "não consigo entrar"],
           "sales": ["mudar de plano", "tabela de preços", "plano novo"],
           "legal": ["cláusula", "privacidade", "advogado"]},
}
LANGUAGES = ("de", "en", "es", "fr")  # the routing task's; `uniform_noise_lines` adds Italian and Portuguese
SIX_LANGUAGES = ("de", "en", "es", "fr", "it", "pt")
FILLER = {
    "en": "hello please my account today thanks again the team order yesterday help soon",
    "es": "hola por favor mi cuenta hoy gracias otra vez el equipo pedido ayer ayuda pronto",
    "fr": "bonjour merci mon compte aujourd'hui encore l'équipe commande hier aide bientôt svp",
    "de": "hallo bitte mein Konto heute danke nochmal das Team Bestellung gestern Hilfe bald",
    "it": "ciao per favore il mio conto oggi grazie ancora la squadra ordine ieri aiuto presto",
    "pt": "olá por favor minha conta hoje obrigado novamente a equipe pedido ontem ajuda logo",
}
# Each option's description names its keyword family, in every language, the way a routing prompt
# lists what belongs to each team: the model learns to match the message against the options.


def team_question(languages: tuple[str, ...] = LANGUAGES) -> dict[str, Any]:
    """The routing question, each team described by its first keyword in every language of the task."""
    return {"team": {"type": "choice", "instructions": "Which team should handle this message?",
                     "criteria": {team: ", ".join(KEYWORDS[lang][team][0] for lang in sorted(languages))
                                  for team in TEAMS}}}


QUESTION = team_question()
SIX_LANGUAGE_QUESTION = team_question(SIX_LANGUAGES)


def routing_lines(n: int, seed: int = 0, noisy_language: str | None = "de", noisy_share: float = 0.4,
                  languages: tuple[str, ...] = LANGUAGES, uniform_noise: float = 0.0) -> list[dict[str, Any]]:
    """`n` labelled lines in `laya calibrate` / `laya train` JSONL form, each with its true team, language
    and whether its label was flipped, for analysis (`write_jsonl` leaves those out).

    Noise comes from the sloppy annotator of `noisy_language` (`noisy_share` of its labels flipped), or,
    with `uniform_noise`, from every language alike. The defaults give the same lines as ever."""
    rng = random.Random(seed)
    question = QUESTION if tuple(sorted(languages)) == LANGUAGES else team_question(languages)
    out = []
    for _ in range(n):
        lang = rng.choice(sorted(languages))
        team = rng.choice(TEAMS)
        words = [rng.choice(FILLER[lang].split()) for _ in range(rng.randint(4, 12))]
        words.insert(rng.randint(0, len(words)), KEYWORDS[lang][team][0])
        label, flipped = team, False
        if (lang == noisy_language and rng.random() < noisy_share
                or uniform_noise and rng.random() < uniform_noise):  # the uniform draw only when asked
            label, flipped = rng.choice([t for t in TEAMS if t != team]), True
        out.append({"state": " ".join(words), "questions": question, "labels": {"team": label},
                    "team": team, "language": lang, "flipped": flipped})
    return out


def uniform_noise_lines(n: int, seed: int = 0, noise: float = 0.1) -> list[dict[str, Any]]:
    """The routing task in six languages with `noise` of the labels another team's, uniformly at random:
    which answers are wrong is not learnable from the input, so no act head can beat the top probability."""
    return routing_lines(n, seed, noisy_language=None, languages=SIX_LANGUAGES, uniform_noise=noise)


APP_FOOTER = {"en": "sent from my phone", "es": "enviado desde mi móvil", "fr": "envoyé de mon mobile",
              "de": "von meinem Handy gesendet"}
NEEDS_PERSON = ("legal", "billing")  # money and contracts go to a person; technical and sales to the bot
HUMAN_QUESTION = {"person": {"type": "noul", "instructions": "Does this message need a person rather than the bot?",
                             "criteria": {"true": "refunds, invoices, contracts, privacy, lawyers",
                                          "false": "crashes, log-in problems, prices, new plans"}}}


def app_footer_lines(n: int, seed: int = 0, app_share: float = 0.08, app_noise: float = 0.6
                     ) -> list[dict[str, Any]]:
    """`n` lines of a yes/no question (does the message need a person?) whose answer the keyword decides.

    A share `app_share` of the messages end with the mobile app's footer ("sent from my phone"); their
    labels come from a sloppy annotator who answers the opposite `app_noise` of the time (4.8% noise
    overall). The keyword is as clear there as elsewhere and the footer rare, so a model fitted on these
    labels stays confident where it is most often wrong (measured: most of its wrong answers there have
    an fp32 top probability of 1.0): a task where the top probability misleads and the footer tells."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lang = rng.choice(LANGUAGES)
        team = rng.choice(TEAMS)
        words = [rng.choice(FILLER[lang].split()) for _ in range(rng.randint(4, 12))]
        words.insert(rng.randint(0, len(words)), KEYWORDS[lang][team][0])
        app = rng.random() < app_share
        if app:
            words.append(APP_FOOTER[lang])
        truth = team in NEEDS_PERSON
        flipped = app and rng.random() < app_noise
        out.append({"state": " ".join(words), "questions": HUMAN_QUESTION, "labels": {"person": truth != flipped},
                    "team": team, "person": truth, "language": lang, "app": app, "flipped": flipped})
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
