"""Small local encoder-decoder models with real, locally trained tokenizers, saved to folders and
registered through a models file: the same ``from_pretrained`` path a hub pair takes. Used by the text
pipeline, UI, distillation and regression tests."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from pipelines.paths import PROJECT_ROOT
from pipelines.quality.sets import project_documents, project_sentences

LANGS = ["eng_Latn", "fra_Latn", "deu_Latn"]
# family -> task; BART and T5 summarize, M2M100 (language tokens) and Marian translate
FAMILIES = {"bart": "summarize", "t5": "summarize", "m2m_100": "translate", "marian": "translate"}


def train_tokenizer(folder: Path, extra_specials=()):
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(project_sentences() + [d["document"] for d in project_documents()], vocab_size=600,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", *extra_specials])
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", additional_special_tokens=list(extra_specials), model_max_length=128)
    tok.save_pretrained(folder)
    return tok


def make_model(kind: str, tok, layers: int, seed: int):
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        GenerationConfig,
        M2M100Config,
        M2M100ForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(seed)
    start = 1 if kind in ("t5", "marian") else 2  # T5 and Marian start decoding from the pad token
    if kind == "t5":
        model = T5ForConditionalGeneration(T5Config(
            vocab_size=len(tok), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=layers, num_heads=4,
            pad_token_id=1, eos_token_id=2, decoder_start_token_id=1, initializer_factor=3.0, tie_word_embeddings=False))
    else:
        common = dict(vocab_size=len(tok), d_model=64, encoder_layers=2, decoder_layers=layers, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=start, init_std=0.3,
                      tie_word_embeddings=False)
        cls, cfg = {"bart": (BartForConditionalGeneration, BartConfig), "m2m_100": (M2M100ForConditionalGeneration, M2M100Config),
                    "marian": (MarianMTModel, MarianConfig)}[kind]
        model = cls(cfg(**common))
    model = model.eval()
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=1, decoder_start_token_id=start, bos_token_id=0,
                                               max_length=40, no_repeat_ngram_size=3)
    return model


def build_local_models(root: Path) -> Path:
    """Main (2 decoder layers) and small (1 layer) models of each family, and a models file with, per family,
    an assisted pair ``<kind>-pair`` and a prompt-lookup pair ``<kind>-lookup``."""
    pairs = {}
    for kind, task in FAMILIES.items():
        specials = LANGS if kind == "m2m_100" else ()
        for role, layers, seed in (("main", 2, 0), ("small", 1, 1)):
            folder = root / f"{kind}-{role}"
            tok = train_tokenizer(folder, specials)
            make_model(kind, tok, layers, seed).save_pretrained(folder)
        langs = {"languages": LANGS} if kind == "m2m_100" else {}
        pairs[f"{kind}-pair"] = {"task": task, "main": {"local": str(root / f"{kind}-main")},
                                 "assistant": {"local": str(root / f"{kind}-small")}, "share_encoder": True, **langs,
                                 **({"draft": "model+prompt-lookup"} if task == "summarize" else {})}
        pairs[f"{kind}-lookup"] = {"task": task, "main": {"local": str(root / f"{kind}-main")}, "draft": "prompt-lookup",
                                   **langs}
    project = yaml.safe_load((PROJECT_ROOT / "models.yaml").read_text())
    pairs["whisper-base"] = project["pairs"][project["defaults"]["asr"]]  # the embedded ASR pair, as shipped
    path = root / "models.yaml"
    path.write_text(yaml.safe_dump({"pairs": pairs, "defaults": {"summarize": "bart-pair", "translate": "m2m_100-pair",
                                                                 "asr": "whisper-base"}}))
    return path
