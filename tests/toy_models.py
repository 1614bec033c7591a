"""Small random-weight models of every family the engine supports, built in code (no downloads)."""

from __future__ import annotations

import torch

VOCAB = 48


def _enc_dec_config(kind: str, layers: int, seed_vocab: int = VOCAB):
    from transformers import BartConfig, M2M100Config, MarianConfig, MBartConfig, PegasusConfig

    common = dict(vocab_size=seed_vocab, d_model=32, encoder_layers=2, decoder_layers=layers,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_position_embeddings=128, dropout=0.0, attention_dropout=0.0, init_std=0.3, tie_word_embeddings=False)
    if kind == "bart":
        return BartConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                          forced_bos_token_id=None)
    if kind == "mbart":
        return MBartConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    if kind == "marian":
        return MarianConfig(**common, decoder_vocab_size=seed_vocab, pad_token_id=seed_vocab - 1, eos_token_id=0,
                            decoder_start_token_id=seed_vocab - 1, share_encoder_decoder_embeddings=True)
    if kind == "m2m_100":
        return M2M100Config(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    if kind == "t5":
        from transformers import T5Config

        return T5Config(vocab_size=seed_vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=layers,
                        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                        initializer_factor=8.0, tie_word_embeddings=False)
    if kind == "pegasus":
        return PegasusConfig(**common, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    raise ValueError(kind)


ENC_DEC = ("bart", "mbart", "marian", "m2m_100", "pegasus", "t5")
CAUSAL = ("llama", "gpt2")


def _plain_generation_config(model) -> None:
    from transformers import GenerationConfig

    c = model.config
    model.generation_config = GenerationConfig(
        eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
        decoder_start_token_id=getattr(c, "decoder_start_token_id", None), bos_token_id=getattr(c, "bos_token_id", None),
    )


def make_enc_dec(kind: str, layers: int = 2, seed: int = 0):
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(seed)
    model = AutoModelForSeq2SeqLM.from_config(_enc_dec_config(kind, layers)).eval()
    _plain_generation_config(model)
    return model


def make_causal(kind: str, layers: int = 2, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "llama":
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256, initializer_range=0.25, tie_word_embeddings=False,
                             bos_token_id=0, eos_token_id=2, pad_token_id=1)
        model = LlamaForCausalLM(config).eval()
    else:
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=256, initializer_range=0.25, tie_word_embeddings=False,
                            bos_token_id=0, eos_token_id=2, pad_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(config).eval()
    _plain_generation_config(model)
    return model


def sources(batch: int, seed: int = 1, low: int = 3, lengths=(5, 9, 7, 12, 4, 10, 6, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source token ids (pad 1) with ragged lengths and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths[:batch])
    ids = torch.full((batch, width), 1, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b in range(batch):
        n = lengths[b % len(lengths)]
        ids[b, :n] = torch.randint(low, VOCAB - 2, (n,), generator=g)
        mask[b, :n] = 1
    return ids, mask
