"""Language codes and names: ISO 639-1 (``de``), ISO 639-3 (``deu``, the eval sets' codes) and the FLORES-200
tokens NLLB uses (``deu_Latn``), with the English name a person reads (``German``)."""

from __future__ import annotations

# (ISO 639-1, ISO 639-3, FLORES-200, English name)
LANGUAGES: tuple[tuple[str, str, str, str], ...] = (
    ("en", "eng", "eng_Latn", "English"),
    ("de", "deu", "deu_Latn", "German"),
    ("fr", "fra", "fra_Latn", "French"),
    ("es", "spa", "spa_Latn", "Spanish"),
    ("it", "ita", "ita_Latn", "Italian"),
    ("pt", "por", "por_Latn", "Portuguese"),
    ("ru", "rus", "rus_Cyrl", "Russian"),
    ("nl", "nld", "nld_Latn", "Dutch"),
    ("zh", "zho", "zho_Hans", "Chinese"),
    ("ja", "jpn", "jpn_Jpan", "Japanese"),
)


def language_name(code: str) -> str:
    """The English name of ``code`` in any of the three forms; the code itself when unknown."""
    for row in LANGUAGES:
        if code in row[:3]:
            return row[3]
    return code


def code_in(code: str, accepted: tuple[str, ...]) -> str:
    """``code`` (any form) written the way a pair's ``accepted`` list writes it (``deu`` -> ``deu_Latn`` for
    NLLB, ``de`` for a chat model); ``code`` unchanged when no form of it is accepted."""
    for row in LANGUAGES:
        if code in row[:3]:
            for form in row[:3]:
                if form in accepted:
                    return form
    return code
