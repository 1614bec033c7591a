"""The main model as the teacher: its greedy output is the label (decoded by Tandem's batched engine exactly
as transcription decodes), and its top-k log-probabilities at every label position (teacher forcing) are the
soft targets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..models.loading import ModelRef
from ..models.registry import Pair
from .options import TOPK


class Teacher:
    """The main model on ``device``, its engine and how its prompts and rules are made: for Whisper those of
    the ASR pipeline itself (``WhisperRunner``). ``drafting`` (a registry pair whose main model is ``ref``):
    labels are decoded with that pair's assistant drafting, which gives plain greedy decoding's tokens (the
    engine's exactness) in fewer main-model passes; None: plain decoding."""

    def __init__(self, ref: ModelRef, dtype: str, device: str = "cpu", drafting: Pair | None = None) -> None:
        import torch

        from ..models.pairs import load_pair

        self.torch, self.ref, self.dtype, self.device = torch, ref, dtype, device
        self.is_whisper = is_whisper_ref(ref)
        if drafting is not None and drafting.main != ref:
            raise ValueError(f"pair {drafting.name!r} drafts for {drafting.main}, not for {ref}")
        self.drafter = drafting.name if drafting is not None else None
        pair = (replace(drafting, dtype=dtype) if drafting is not None else
                Pair(name=f"distill-teacher {ref}", task="asr" if self.is_whisper else "summarize", main=ref,
                     assistant=None, draft="none", share_encoder=False, dtype=dtype))
        if self.is_whisper:
            from ..asr import WhisperRunner

            self.runner = WhisperRunner(pair, dtype, device)
            loaded = self.runner.loaded
        else:
            self.runner = None
            loaded = load_pair(pair, dtype, device)
        self.model, self.decoder, self.tokenizer = loaded.main_model, loaded.main, loaded.tokenizer
        self.engine = loaded.engine if drafting is not None else loaded.plain
        self.gen = self.model.generation_config

    @property
    def name(self) -> str:
        """What labelled a corpus: the model and the dtype (labels from another are other labels)."""
        return f"{self.ref} {self.dtype}"

    def prompt(self, kind: str) -> list[int]:
        if self.is_whisper:  # English transcription; windows of long-form audio decode with timestamps
            return self.runner.prompt("en", "transcribe", timestamps=kind == "window")
        prompt = [self.gen.decoder_start_token_id]
        bos = getattr(self.gen, "forced_bos_token_id", None)
        return prompt + ([bos] if bos is not None else [])

    def rules(self, prompt_len: int, kind: str, max_new: int):
        if self.is_whisper:
            return self.runner.rules(prompt_len, kind == "window", max_new)
        from ..engine import rules_from_generation_config

        return rules_from_generation_config(self.gen, prompt_len, max_new)

    def encode(self, items: list[dict]):
        """The encoder output of a group of items (their "audio", or their "text" for text models)."""
        with self.torch.inference_mode():
            if self.is_whisper:
                return self.decoder.encode(input_features=self.runner.feats([it["audio"] for it in items]))
            limit = min(getattr(self.model.config, "max_position_embeddings", 512) or 512, 512)
            x = self.tokenizer([it["text"] for it in items], return_tensors="pt", padding=True, truncation=True,
                               max_length=limit)
            return self.decoder.encode(input_ids=x.input_ids.to(self.device), attention_mask=x.attention_mask.to(self.device))

    def greedy(self, items: list[dict], enc, max_new: int) -> list[list[int]]:
        """The main model's greedy tokens for each item, given their encoder output."""
        from ..engine import DecodeOptions

        labels: list[list[int]] = [[] for _ in items]
        for kind in sorted({it["kind"] for it in items}):
            rows = [i for i, it in enumerate(items) if it["kind"] == kind]
            sub = enc.select(self.torch.tensor(rows, device=enc.hidden.device))
            prompt = self.prompt(kind)
            rules = self.rules(len(prompt), kind, max_new)
            result = self.engine.generate([prompt for _ in rows], rules, DecodeOptions(max_new_tokens=max_new),
                                          encoder_output=sub)
            for i, toks in zip(rows, result.tokens):
                labels[i] = list(toks)
        return labels

    def labels(self, items: list[dict], max_new: int) -> list[list[int]]:
        """The main model's greedy tokens for a group of items."""
        return self.greedy(items, self.encode(items), max_new)

    def features(self, items: list[dict], max_new: int, labels: list[list[int]] | None = None):
        """Encoder output (float16, host), its mask, prompts and labels of a group of items; the labels are
        decoded here unless given (a committed corpus already holds them)."""
        enc = self.encode(items)
        prompts = [self.prompt(it["kind"]) for it in items]
        if labels is None:
            labels = self.greedy(items, enc, max_new)
        mask = None if enc.mask is None else enc.mask.cpu().numpy().astype(np.int8)
        return enc.hidden.float().cpu().numpy().astype(np.float16), mask, prompts, labels

    def topk(self, hidden: np.ndarray, mask: np.ndarray | None, prompts, labels) -> tuple[np.ndarray, np.ndarray]:
        """The teacher's top-k log-probabilities at every label position (teacher forcing)."""
        torch = self.torch
        logits = forced_logits(self.model, torch.from_numpy(hidden).to(self.device, self.model.dtype),
                               None if mask is None else torch.from_numpy(mask).long().to(self.device), prompts, labels)
        ids, lps = [], []
        for b, (p, y) in enumerate(zip(prompts, labels)):
            lp = torch.log_softmax(logits[b, len(p) - 1 : len(p) - 1 + len(y)].float(), dim=-1)
            v, i = lp.topk(TOPK, dim=-1)
            ids.append(i.cpu().numpy().astype(np.int32))
            lps.append(v.cpu().numpy().astype(np.float16))
        return np.concatenate(ids), np.concatenate(lps)


def forced_logits(model, hidden, enc_mask, prompts: list[list[int]], labels: list[list[int]], grad: bool = False,
                  rows=None):
    """Logits (B, L, V) of a Whisper/encoder-decoder/decoder-only-over-encoder model fed prompt + labels
    (right-padded: causal attention keeps the padding from touching earlier positions), on the model's device.
    ``rows`` (a Whisper student's draft vocabulary, a LongTensor of token ids): only those columns, (B, L, len(rows)),
    from the head's rows: logits[..., j] = h . W[rows[j]]."""
    import torch

    ids = forced_ids(prompts, labels, hidden.device)
    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with ctx:
        if model.config.model_type == "whisper" and not model.config.is_encoder_decoder:
            if rows is not None:
                h = model.model.decoder(input_ids=ids, encoder_hidden_states=hidden, use_cache=False).last_hidden_state
                return h @ model.proj_out.weight[rows].T
            return model(input_ids=ids, encoder_outputs=(hidden,), use_cache=False).logits
        from transformers.modeling_outputs import BaseModelOutput

        return model(encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=enc_mask,
                     decoder_input_ids=ids, use_cache=False).logits


def forced_ids(prompts: list[list[int]], labels: list[list[int]], device):
    """prompt + labels of each item, right-padded with its last token: a LongTensor (B, L) on ``device``."""
    import torch

    seqs = [list(p) + list(y) for p, y in zip(prompts, labels)]
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [s[-1]] * (width - len(s)) for s in seqs], device=device)


def is_whisper_ref(ref: ModelRef) -> bool:
    from ..models.loading import load_config

    return load_config(ref).model_type == "whisper"
