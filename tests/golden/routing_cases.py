"""Routing cases: states whose upstream route (model and reason) `routing.json` records.

Two sets. `HAND` are chosen one by one: every script the router names, the Latin languages it
names, structured and conversation states, the traps (one German line in an English ticket, code,
accented names, acronyms, digits only) and explicit language codes. `generated()` composes about
300 more from per-language fragments with a seeded RNG -- several languages in one state, casing,
accents stripped, fields and turns -- so agreement is measured beyond the cases someone picked.
Every state is JSON, so the same value reaches upstream and us.
"""

from __future__ import annotations

import random
import unicodedata
from typing import Any

SEED = 20250415
N_GENERATED = 300

# Support-style sentences written for these tests, a few per language.
FRAGMENTS: dict[str, list[str]] = {
    "en": ["I was billed twice this month and would like the extra charge returned.",
           "Could you tell me why my parcel has not arrived yet?",
           "The app crashes every time I try to upload a photo.",
           "Please cancel the subscription before the next renewal date.",
           "We have been waiting for three days and nobody has answered.",
           "Thanks for the quick reply, that fixed it.",
           "Where can I download the invoice for last week's order?"],
    "de": ["Ich habe meine Bestellung vor einer Woche aufgegeben und sie ist noch nicht da.",
           "Können Sie mir bitte sagen, wann das Paket ankommt?",
           "Die Rechnung ist falsch, ich wurde zweimal belastet.",
           "Mein Passwort funktioniert seit heute nicht mehr.",
           "Wir möchten unser Abo zum Monatsende kündigen."],
    "fr": ["Je n'ai toujours pas reçu ma commande, pouvez-vous vérifier?",
           "Le paiement a été refusé deux fois ce matin.",
           "Merci de me rembourser la somme débitée par erreur.",
           "Nous voulons changer l'adresse de livraison pour cette commande.",
           "Pourquoi mon compte est-il bloqué depuis hier?"],
    "es": ["No he recibido el reembolso que me prometieron la semana pasada.",
           "Quiero cambiar la dirección de envío de mi pedido.",
           "La aplicación se cierra cuando intento pagar con tarjeta.",
           "Necesito una factura para la compra que hice ayer.",
           "¿Por qué me cobraron dos veces por el mismo producto?"],
    "pt": ["Não consigo acessar minha conta desde ontem.",
           "Meu pedido chegou com defeito e quero trocar.",
           "Vocês podem me enviar a nota fiscal por email?",
           "O aplicativo está muito lento depois da atualização.",
           "Gostaria de cancelar a assinatura ainda hoje."],
    "it": ["Non ho ancora ricevuto il pacco che ho ordinato.",
           "Vorrei sapere perché la fattura è sbagliata.",
           "Il mio account è stato bloccato senza motivo.",
           "Potete aiutarmi a cambiare la password?",
           "Grazie mille, adesso funziona tutto."],
    "nl": ["Mijn bestelling is nog steeds niet aangekomen.",
           "Het pakket is beschadigd en ik wil een nieuwe.",
           "Kunt u mij vertellen wanneer de monteur komt?",
           "De betaling is mislukt maar het geld is wel afgeschreven."],
    "pl": ["Zamówienie nie dotarło, proszę o pomoc.",
           "Płatność została pobrana dwukrotnie z mojego konta.",
           "Chciałbym zmienić adres dostawy."],
    "tr": ["Siparişim hâlâ gelmedi, yardımcı olur musunuz?",
           "Ödeme iki kez çekildi, iade istiyorum."],
    "ru": ["Мой заказ до сих пор не пришёл, помогите пожалуйста.",
           "Деньги списали два раза, верните лишнее."],
    "uk": ["Моє замовлення досі не доставлено.",
           "Будь ласка, поверніть кошти за скасоване замовлення."],
    "el": ["Η παραγγελία μου δεν έχει φτάσει ακόμα.",
           "Χρεώθηκα δύο φορές για την ίδια αγορά."],
    "ar": ["لم يصل طلبي حتى الآن، أرجو المساعدة.",
           "تم خصم المبلغ مرتين من بطاقتي."],
    "he": ["ההזמנה שלי עדיין לא הגיעה.", "חויבתי פעמיים על אותה הזמנה."],
    "hi": ["मेरा ऑर्डर अभी तक नहीं आया है।", "कृपया मेरा पैसा वापस कर दीजिए।"],
    "zh": ["我的订单还没有到，请帮我查一下。", "我被重复扣款了，请退款。"],
    "ja": ["注文した商品がまだ届いていません。", "パスワードを忘れてしまいました。"],
    "ko": ["주문한 상품이 아직 도착하지 않았습니다.", "결제가 두 번 되었어요. 환불해 주세요."],
    "th": ["สินค้าที่สั่งยังไม่มาถึงเลยครับ", "ช่วยคืนเงินให้หน่อยค่ะ"],
    "code": ["Traceback (most recent call last): File \"app.py\", line 12, in main",
             "result = client.get(url, timeout=30); print(result.status_code)",
             "os.path.join(base_dir, 'config', 'settings.yaml')",
             "SELECT * FROM orders WHERE id = 42;"],
    "ids": ["ORD-2024-0091 / SKU 77-A / user@example.com / v2.3.1",
            "https://shop.example.com/orders/991?ref=mail",
            "MON DES EST LA NYC",
            "KEY-884 PT-BR OS/2 C:\\DOS\\MODE"],
    "names": ["Ticket from José Muñoz, forwarded by Zoë Brontë.",
              "Customer: François Lefèvre"],
    "num": ["12345 67890 !!!", "2024-05-01 12:00:00 +0200", "€ 49,99 — 3 × 12"],
}

LATIN = ["en", "de", "fr", "es", "pt", "it", "nl", "pl", "tr"]
OTHER = ["ru", "uk", "el", "ar", "he", "hi", "zh", "ja", "ko", "th"]
NOISE = ["code", "ids", "names", "num"]

GERMAN = "Ich habe meine Bestellung vor einer Woche aufgegeben und sie ist noch nicht da."
ENGLISH_NOTE = ("Agent note: the customer called about order 5531. Please check the warehouse log and reply "
                "within two business days, as we promised in the last email.")


def _case(cid: str, state: Any, lang: str | None = None, default: str = "multilingual") -> dict[str, Any]:
    out: dict[str, Any] = {"id": cid, "state": state, "default": default}
    if lang is not None:
        out["lang"] = lang
    return out


def hand() -> list[dict[str, Any]]:
    """The picked cases."""
    f = FRAGMENTS
    cases = [_case(f"lang-{code}", " ".join(f[code][:2])) for code in LATIN + OTHER]
    cases += [
        _case("en-one-sentence", f["en"][0]),
        _case("en-question", "Why hasn't my card been delivered?"),
        _case("en-accented-names", f["names"][0] + " " + f["en"][1]),
        _case("en-cafe", "I ordered a café latte and a croissant but the receipt shows two."),
        _case("pt-short", "Quero cancelar"),
        _case("pt-short-2", "Esqueci minha senha"),
        _case("pt-no-accents", "Voce pode me mandar a nota fiscal?"),
        _case("de-shouted", "WIE SPÄT IST ES IN KÖLN"),
        _case("acronyms", "MON DES EST LA"),
        _case("acronyms-under-english", "Tonight's games are listed below.\nMON DES EST LA"),
        _case("digits", "12345 67890"),
        _case("punctuation", "!!! ??? ..."),
        _case("empty", ""),
        _case("none", None),
        _case("empty-dict", {}),
        _case("code-only", f["code"][1]),
        _case("ids-only", f["ids"][0]),
        _case("en-with-traceback", f["en"][2] + "\n" + f["code"][0] + "\n" + f["code"][2]),
        _case("en-with-german-line", f["en"][0] + " " + f["en"][1] + "\n" + GERMAN + "\n" + f["en"][5]),
        _case("en-note-german-field", {"note": ENGLISH_NOTE, "message": GERMAN, "priority": 2}),
        _case("object-fr", {"subject": "Commande", "body": f["fr"][0], "order": {"id": 42, "sku": "A-1"}}),
        _case("object-en", {"subject": "Refund", "body": f["en"][0], "tags": ["billing", "urgent"]}),
        _case("conversation-en", [{"role": "user", "content": f["en"][1]},
                                  {"role": "assistant", "content": f["en"][5]}]),
        _case("conversation-es", [{"role": "user", "content": f["es"][0]},
                                  {"role": "assistant", "content": "I am sorry to hear that. Let me check."},
                                  {"role": "user", "content": f["es"][4]}]),
        _case("conversation-ja-en", [{"role": "user", "content": f["ja"][0]},
                                     {"role": "assistant", "content": f["en"][1]}]),
        _case("greek-symbol-in-english", "Set α to 0.05 and rerun the test, the results should change."),
        _case("russian-name-in-english", "Our contact is Дмитрий Петрович and he will call you today."),
        _case("brand-in-chinese", "我的 iPhone 15 Pro Max 屏幕坏了"),
        _case("deep-nesting", {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": GERMAN}}}}}}}}),
        _case("default-english-undecided", "Quero cancelar", default="english"),
        _case("default-english-digits", "12345", default="english"),
        _case("hint-de", f["en"][0], lang="de"),
        _case("hint-en", GERMAN, lang="en"),
        _case("hint-en-US", GERMAN, lang="en-US"),
        _case("hint-en_GB.UTF-8", GERMAN, lang="en_GB.UTF-8"),
        _case("hint-pt-BR", f["en"][0], lang="pt-BR"),
        _case("hint-blank", f["en"][0], lang=" "),
        _case("hint-empty", GERMAN, lang=""),
        _case("hint-C", GERMAN, lang="C"),
        _case("hint-und", f["en"][0], lang="und"),
        _case("hint-unknown-code", f["en"][0], lang="xx"),
        _case("hint-ENGLISH", GERMAN, lang="ENGLISH"),
        _case("hint-eng", GERMAN, lang="eng"),
    ]
    return cases


def _strip_accents(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if not unicodedata.combining(ch))


def _casing(rng: random.Random, text: str) -> str:
    roll = rng.random()
    if roll < 0.1:
        return text.upper()
    if roll < 0.2:
        return text.lower()
    if roll < 0.28:
        return _strip_accents(text)
    if roll < 0.32:
        return text.title()
    return text


def _text(rng: random.Random, code: str) -> str:
    """One to three sentences of one language (or noise)."""
    picks = rng.sample(FRAGMENTS[code], k=min(len(FRAGMENTS[code]), rng.randint(1, 3)))
    return _casing(rng, " ".join(picks))


def _pool(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.35:
        return "en"
    if roll < 0.75:
        return rng.choice(LATIN)
    if roll < 0.9:
        return rng.choice(OTHER)
    return rng.choice(NOISE)


def generated(n: int = N_GENERATED, seed: int = SEED) -> list[dict[str, Any]]:
    """`n` states composed by `random.Random(seed)`: parts from one to four languages, joined into a
    string (by spaces or lines), an object of fields, a conversation or a nested object."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        parts = [_text(rng, _pool(rng)) for _ in range(rng.choice([1, 1, 2, 2, 3, 4]))]
        shape = rng.random()
        state: Any
        if shape < 0.3:
            state = " ".join(parts)
        elif shape < 0.55:
            state = "\n".join(parts)
        elif shape < 0.75:
            names = ["subject", "body", "note", "customer", "summary"]
            state = {names[j % len(names)]: p for j, p in enumerate(parts)}
            if rng.random() < 0.3:
                state["meta"] = {"id": rng.randint(1, 10_000), "channel": "email"}
        elif shape < 0.92:
            state = [{"role": "user" if j % 2 == 0 else "assistant", "content": p} for j, p in enumerate(parts)]
        else:
            state = {"ticket": {"thread": [{"content": p} for p in parts]}}
        lang = None
        if rng.random() < 0.06:
            lang = rng.choice(["de", "en", "en-US", " ", "fr-CA", "zz", "C", "pt_BR.UTF-8"])
        default = "english" if rng.random() < 0.1 else "multilingual"
        out.append(_case(f"gen-{i:03d}", state, lang, default))
    return out


def cases() -> list[dict[str, Any]]:
    """Every case, hand-picked first."""
    return hand() + generated()
