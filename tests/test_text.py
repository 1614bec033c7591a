"""Translation and summarization end to end on small local models with real (locally trained) tokenizers,
saved to folders and registered through a models file: the same from_pretrained path a hub pair uses."""

from pathlib import Path

import pytest
import torch
import yaml

from pipelines.evalsets import project_documents, project_sentences
from pipelines.registry import load_registry
from pipelines.text import TextInputError, TextOptions, TextRunner, run_text

LANGS = ["eng_Latn", "fra_Latn", "deu_Latn"]


def _tokenizer(folder: Path, extra_specials=()):
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


def _model(kind: str, tok, layers: int, seed: int):
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), d_model=64, encoder_layers=2, decoder_layers=layers, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, init_std=0.3,
                  tie_word_embeddings=False)
    model = (BartForConditionalGeneration(BartConfig(**common)) if kind == "bart"
             else M2M100ForConditionalGeneration(M2M100Config(**common))).eval()
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=1, decoder_start_token_id=2, bos_token_id=0,
                                               max_length=40, no_repeat_ngram_size=3)
    return model


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-models")
    pairs = {}
    for kind, task in (("bart", "summarize"), ("m2m_100", "translate")):
        specials = LANGS if kind == "m2m_100" else ()
        for role, layers, seed in (("main", 2, 0), ("small", 1, 1)):
            folder = root / f"{kind}-{role}"
            tok = _tokenizer(folder, specials)
            _model(kind, tok, layers, seed).save_pretrained(folder)
        pairs[f"{kind}-pair"] = {"task": task, "main": {"local": str(root / f"{kind}-main")},
                                 "assistant": {"local": str(root / f"{kind}-small")}, "share_encoder": True,
                                 **({"languages": LANGS} if kind == "m2m_100" else {"draft": "model+prompt-lookup"})}
        pairs[f"{kind}-lookup"] = {"task": task, "main": {"local": str(root / f"{kind}-main")}, "draft": "prompt-lookup",
                                   **({"languages": LANGS} if kind == "m2m_100" else {})}
    path = root / "models.yaml"
    path.write_text(yaml.safe_dump({"pairs": pairs, "defaults": {"summarize": "bart-pair", "translate": "m2m_100-pair"}}))
    return path


def _hf_reference(runner: TextRunner, source: list[int], prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([source])
    out = runner.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                                max_new_tokens=max_new, decoder_input_ids=torch.tensor([prompt]))
    return out[0].tolist()[len(prompt):]


@pytest.mark.parametrize("name", ["bart-pair", "bart-lookup"])
def test_summarize_assisted_is_identical_to_plain_and_to_generate(models_file, name):
    registry = load_registry(models_file)
    runner = TextRunner(registry.get(name))
    doc = project_documents()[0]["document"][:250]
    assert len(runner._source_ids(doc, None)) <= runner.input_limit  # one chunk: comparable with generate()
    result = runner.summarize(doc, TextOptions(compare=True, max_new_tokens=24))
    assert result.identical is True and result.drafted > 0
    ref = _hf_reference(runner, runner._source_ids(doc, None), runner._prompt(None), 24)
    assert result.output == runner.tok.decode(ref, skip_special_tokens=True).strip()


def test_long_documents_are_chunked_and_said_so(models_file):
    runner = TextRunner(load_registry(models_file).get("bart-pair"))
    long_doc = " ".join(d["document"] for d in project_documents()[:3])  # ~600 words, far over 128 tokens
    result = runner.summarize(long_doc, TextOptions(max_new_tokens=8))
    assert result.rows > 1 and "chunks of whole sentences" in result.notes[0]
    truncated = runner.summarize(long_doc, TextOptions(max_new_tokens=8, long_input="truncate"))
    assert truncated.rows == 1 and "truncated" in truncated.notes[0]


def test_translate_batches_sentences_and_keeps_paragraphs(models_file):
    registry = load_registry(models_file)
    pair = registry.get("m2m_100-pair")
    runner = TextRunner(pair)
    text = "The train leaves at seven. Where is the bank?\n\nPlease close the window."
    result = runner.translate(text, TextOptions(src="eng_Latn", tgt="fra_Latn", compare=True, max_new_tokens=12,
                                                batch_size=3))
    assert result.rows == 3 and result.identical is True
    assert result.output.count("\n\n") == 1
    first = runner._source_ids("The train leaves at seven.", runner._lang_id("eng_Latn", "src"))
    assert first[0] == runner.tok.convert_tokens_to_ids("eng_Latn") and first[-1] == runner.tok.eos_token_id
    prompt = runner._prompt(runner._lang_id("fra_Latn", "tgt"))
    ref = runner.tok.decode(_hf_reference(runner, first, prompt, 12), skip_special_tokens=True).strip()
    assert result.output.startswith(ref)


def test_bad_inputs_are_clear(models_file):
    registry = load_registry(models_file)
    runner = TextRunner(registry.get("m2m_100-pair"))
    with pytest.raises(TextInputError, match="is not one of the pair's languages"):
        runner.translate("Hello.", TextOptions(src="eng_Latn", tgt="klingon"))
    with pytest.raises(TextInputError, match="needs --src"):
        runner.translate("Hello.", TextOptions(tgt="fra_Latn"))
    with pytest.raises(TextInputError, match="the input is empty"):
        runner.translate("   ", TextOptions(src="eng_Latn", tgt="fra_Latn"))
    with pytest.raises(TextInputError, match="characters; the limit is"):
        runner.translate("a" * 300_000, TextOptions(src="eng_Latn", tgt="fra_Latn"))
    with pytest.raises(TextInputError, match="not a summarize pair"):
        run_text(registry.get("m2m_100-pair"), "summarize", ["x"], runner=runner)


def test_cli_summarize_from_stdin(models_file, monkeypatch, capsys):
    import io

    from pipelines.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(project_documents()[1]["document"]))
    code = main(["--models", str(models_file), "summarize", "--compare", "--max-new-tokens", "16"])
    captured = capsys.readouterr()
    assert code == 0 and captured.out.strip()
    assert "identical 1/1" in captured.err and "tokens per main-model call" in captured.err


def test_eval_report_for_text_tasks(models_file):
    from pipelines.evaluation import SCHEMA, evaluate

    report = evaluate("summarize", "bart-pair", "summarize-own", limit=2, repeats=1, models=str(models_file))
    assert report["schema"] == SCHEMA and report["identical_rate"] == 1.0
    assert set(report["quality"]["plain"]) == {"rouge1", "rouge2", "rougeL"}
    items = [{"id": "x", "input": "The train leaves at seven.", "reference": "Le train part a sept heures.",
              "source_lang": "eng_Latn", "target_lang": "fra_Latn"}]
    report = evaluate("translate", "m2m_100-pair", "inline", repeats=1, models=str(models_file), items=items)
    assert set(report["quality"]["assisted"]) == {"bleu", "chrf"} and report["items"] == 1
