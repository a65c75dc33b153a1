"""Function words per Latin-script language, and the letters ordinary English does not use.

Only the closed classes are listed (articles, pronouns, prepositions, auxiliaries, question words,
the politeness words a support message opens with): they appear in any message whatever its
topic, and a handful of them is enough to tell the languages apart. Words that are also common
English tokens (`a`, `no`, `de`, `en`, `over`) stay out of the foreign lists, because one of them
inside English must never make it foreign; the few kept (`do`, `come`, `son`, `per`) count once
however often they repeat. English leaves out what other languages own (`also`, `had`, `just`,
`he`, `or`, and `by`, a Nordic word).

The order of the languages matters: when two score the same, the first named wins.
"""

from __future__ import annotations


def _w(text: str) -> frozenset[str]:
    return frozenset(text.split())


FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "en": _w("""
        the and is are was were be been being to of in for with from on at into onto as
        that this these those it they them their there here what which who whom how why when where
        you your yours we our i she him his
        have has will can would could should might must shall does done doing
        not but if than then because while until nor
        please any some many much every each both few only very too ever never always already yet
        after before between through during without within down
        doesn didn isn aren wasn weren haven hasn couldn wouldn won
        dont wont didnt doesnt isnt wasnt havent ive youre thats whats
    """),
    "fr": _w("""
        le la les des une est sont ont pour dans que qui avec sur pas plus nous vous être
        cette ce ces mais et du au aux ou je tu il elle ils elles
        mon ton ma ta sa mes tes ses deux trois très bien tout tous toute fait
        veux veut peux peut dois doit merci bonjour jour jours mois fois quand comment pourquoi alors donc
    """),
    "de": _w("""
        der die das den dem und ist sind nicht mit für auf von zu sich auch werden wurde wird haben habe
        oder aber ich wir mir mich dir dich uns ein eine einen einem einer
        mein meine meinen meinem meiner diese dieser diesen dieses
        wie wo wann welche im zum zur aus bei nach noch bitte heute jetzt kann kannst gibt
        in was
    """),
    "es": _w("""
        el la los las un una y que por con para es se del al lo le les como pero son
        está este esta ese esa eso esto todo más muy hay su sus mi tu nos ni
        dos tres fue fueron ser tiene tienen tengo puede pueden quiero necesito hemos han
        sobre entre cuando donde porque aunque también ya nada algo aquí hoy gracias
    """),
    "pt": _w("""
        o os as e um uma que em para com não é se do da dos das na nas nos ao aos por pelo pela
        mas são está este esta isso isto muito mais já ainda agora hoje ontem aqui ali
        como quando onde porque dois três tudo nada obrigado obrigada olá
        foi era ser sou tem tenho pode podem quero preciso eu meu minha meus minhas seu sua nosso nossa
        você vocês voce voces vc vcs nao sao ja até tá pra gostaria também tambem estou estamos
        consigo cadê boa tarde noite depois antes então entao ninguém ninguem alguém alguem
        nenhum nenhuma estava ficou fiz deu
    """),
    "it": _w("""
        il lo la le gli un uno una e ed o che di da per con su tra fra non è si mi ci ne
        del della dello dei degli delle nel nell negli nella sul sulla sulle dal dalla dallo dagli
        alla alle agli col sono questo questa anche come più
        ho hai ha abbiamo avete hanno era stato stata devo deve devono voglio vorrei
        mio mia tuo sua quando dove perche molto poco sempre mai già ancora adesso oggi ieri
        grazie ciao scusa
    """),
    "nl": _w("het een van is op te dat niet met voor zijn aan door maar ook worden deze naar wordt"),
    "sv": _w("""
        jag vi ni är och inte att från till behöver får skulle ska vill måste också detta dessa här när hur
        varför vad mitt mina mig dig oss kommer hjälp hjälpa gång gånger lösenord losenord faktura kvittot
        behover hjalp hjalpa nar inställningarna installningarna kraschar skicka blivit
    """),
    "ro": _w("""
        și să este sunt care pentru dar după până fără lui în fost acum vreau trebuie foarte acest această
        nu sau unde când aici rog
    """),
    "bn": _w("""
        ami amar amake amra apni apnar tumi tomar keno kivabe kothay kokhon kobe kintu jodi theke jonno
        sathe kore korte korchi korbo hobe hoyeche chai lagbe parchi nai khub onek ekhon abar ajke taka
        bhalo kharap somossa dhonnobad bhai kichu dorkar ferot
    """),
    "az": _w("""
        və bir bu üçün ilə olan var yox mən sən biz siz onlar daha çox hər nə kimi sonra əgər deyil
        lakin amma artıq də həm yalnız
    """),
}

# Two or three of these words are enough to call a fragment Swedish ("glömt lösenord").
SWEDISH_SHORT = _w("""
    lösenord losenord glömt glomt kvitto kvittot fakturan inloggningen abonnemanget behöver behover
    återbetalning
""")

# Swedish words Danish and Norwegian share: a hint of "not English", never a name on their own.
NORDIC_SHARED = _w("hej ja nej jo tack mig min om kommer får skulle vi")

# Foreign function words that are also everyday English (`do more`, `per day`, `todo list`):
# repeats of them count once.
ENGLISH_COLLISIONS = _w("come son do care todo im per plus")

# Letters of Latin-script languages that English spelling does not use (lower case).
NON_ENGLISH_LETTERS = frozenset(
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ"
    "ăâîșțşţ"
    "ąćęłńśźż"
    "čďěňřšťůž"
    "őű"
    "ğı"
    "āēģīķļņū"
    "đə"
)
