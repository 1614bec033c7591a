"""Language codes and names: ISO 639-1 (``de``), ISO 639-3 (``deu``, the eval sets' codes) and the FLORES-200
tokens NLLB uses (``deu_Latn``), with the English name a person reads (``German``)."""

from __future__ import annotations

# (ISO 639-1, ISO 639-3, FLORES-200) of the languages the evaluation sets and the shipped pairs use
CODES: tuple[tuple[str, str, str], ...] = (
    ("en", "eng", "eng_Latn"), ("de", "deu", "deu_Latn"), ("fr", "fra", "fra_Latn"), ("es", "spa", "spa_Latn"),
    ("it", "ita", "ita_Latn"), ("pt", "por", "por_Latn"), ("ru", "rus", "rus_Cyrl"), ("nl", "nld", "nld_Latn"),
    ("zh", "zho", "zho_Hans"), ("ja", "jpn", "jpn_Jpan"),
)


ISO_639_3 = {  # the NLLB / FLORES codes' language part (e.g. eng_Latn) -> English name
    "eng": "English", "deu": "German", "fra": "French", "spa": "Spanish", "ita": "Italian", "por": "Portuguese",
    "rus": "Russian", "nld": "Dutch", "zho": "Chinese", "jpn": "Japanese", "kor": "Korean", "arb": "Arabic",
    "hin": "Hindi", "tur": "Turkish", "pol": "Polish", "ukr": "Ukrainian", "ces": "Czech", "swe": "Swedish",
    "dan": "Danish", "fin": "Finnish", "ell": "Greek", "heb": "Hebrew", "hun": "Hungarian", "ron": "Romanian",
    "vie": "Vietnamese", "ind": "Indonesian", "tha": "Thai", "cat": "Catalan", "nob": "Norwegian Bokmål",
}
SCRIPTS = {"Hans": "Simplified", "Hant": "Traditional"}


def language_name(code: str) -> str:
    """A language code as people read it: ``eng_Latn`` -> English, ``zho_Hans`` -> Chinese (Simplified),
    ``de`` or ``__de__`` -> German (ISO 639-1 names from Whisper's table); an unknown code is returned as it is."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES as WHISPER_LANGUAGES

    bare = code.strip("_")
    if bare in WHISPER_LANGUAGES:
        return WHISPER_LANGUAGES[bare].title()
    lang, _, script = bare.partition("_")
    if lang in ISO_639_3:
        return ISO_639_3[lang] + (f" ({SCRIPTS[script]})" if script in SCRIPTS else "")
    return code


def code_in(code: str, accepted: tuple[str, ...]) -> str:
    """``code`` (any form) written the way a pair's ``accepted`` list writes it (``deu`` -> ``deu_Latn`` for
    NLLB, ``de`` for a chat model); ``code`` unchanged when no form of it is accepted."""
    for row in CODES:
        if code in row:
            for form in row:
                if form in accepted:
                    return form
    return code
