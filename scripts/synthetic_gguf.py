#!/usr/bin/env python3
"""Write a tiny GGUF with random weights that llama.cpp loads: a stand-in model for tests.

    .venv/bin/python scripts/synthetic_gguf.py --arch gemma3|llama|qwen2 -o FILE [--seed N] [--chat-template]

`gemma3`: Gemma 3's graph and window rule with toy sizes. llama.cpp's gemma3 loader reads the window
from `gemma3.attention.sliding_window` and fixes the layer pattern itself (`set_swa_pattern(6)`: a
layer is windowed when il % 6 < 5, so layer 5 is the one global layer of six; no pattern key is read).
The window is 32 tokens, far shorter than any test prefix, so grafts past the window are cheap to test.
`llama`: the llama graph, no window (one KV cache in a snapshot, so compaction never applies).
`qwen2`: the Qwen2 graph (llama's with Q/K/V biases: the 1.5B instruct model's architecture), no window.

Both have an SPM ("llama") vocabulary of 768 tokens: <unk> <s> </s>, two ChatML markers, the 256
byte-fallback tokens and word pieces. `--chat-template` adds a ChatML `tokenizer.chat_template`.
Weights come from numpy's Generator seeded with --seed: the same arguments give the same bytes.
The trained context is 8192 tokens, so kvgraft's default n_ctx (8192) and selftest's 3,000-token
prefixes fit. Norm weights are F32, matrices F16; each file is about 2 MB.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

ARCHS = ("gemma3", "llama", "qwen2")
N_VOCAB = 768
N_CTX_TRAIN = 8192
N_SWA = 32  # gemma3 only
GEMMA3_SWA_PERIOD = 6  # hard-coded in llama.cpp's gemma3 loader, not a GGUF key
SPECIAL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Words whose every "▁"-prefix becomes a piece, so SPM's pairwise merges can reach the whole word.
WORDS = (
    "the a and of to in is it that was for on with as he she they you we this at by from or but not "
    "river stone light garden number market window silver quiet engine morning story bridge careful "
    "seven orange winter paper letter mountain kitchen answer reason simple table forest signal yellow "
    "seventeen coffee harbor village circle measure thunder question which word text above came up most "
    "often why carries finds holds opens follows counts builds keeps watches crosses marks turns"
).split()


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int = 128
    n_head: int = 2
    n_head_kv: int = 1
    head_dim: int = 64
    n_ff: int = 256


SHAPES = {"gemma3": Shape(n_layer=6), "llama": Shape(n_layer=4), "qwen2": Shape(n_layer=4)}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, SPM scores (higher merges first) and token types; N_VOCAB entries, always the same."""
    tokens = list(SPECIAL)
    types = [TokenType.UNKNOWN] + [TokenType.CONTROL] * (len(SPECIAL) - 1)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(33, 127)]
    for word in WORDS:
        full = "▁" + word
        pieces += [full[:n] for n in range(2, len(full) + 1)]
    for piece in dict.fromkeys(pieces):  # unique, in first-seen order
        tokens.append(piece)
        types.append(TokenType.NORMAL)
    if len(tokens) > N_VOCAB:
        raise AssertionError(f"{len(tokens)} tokens do not fit N_VOCAB {N_VOCAB}")
    filler = 0
    while len(tokens) < N_VOCAB:  # unused padding ids, so every build has exactly N_VOCAB tokens
        tokens.append(f"<unused{filler}>")
        types.append(TokenType.UNUSED)
        filler += 1
    scores = [0.0 if t != TokenType.NORMAL else -float(i) for i, t in enumerate(types)]
    return tokens, scores, [int(t) for t in types]


def _matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) numpy array, i.e. a GGUF tensor of ne [cols, rows]: out = W @ in with fan-in cols."""
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """RMS norm weights near 1 (Gemma's converter stores 1 + w, so the file holds the final scale)."""
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _bias(rng: np.random.Generator, n: int) -> np.ndarray:
    return (0.1 * rng.standard_normal(n)).astype(np.float32)


def _tensors(arch: str, shape: Shape, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    q_dim = shape.n_head * shape.head_dim
    kv_dim = shape.n_head_kv * shape.head_dim
    out = [("token_embd.weight", _matrix(rng, N_VOCAB, shape.n_embd)), ("output_norm.weight", _norm(rng, shape.n_embd))]
    for il in range(shape.n_layer):
        blk = f"blk.{il}."
        layer = [
            ("attn_norm.weight", _norm(rng, shape.n_embd)),
            ("attn_q.weight", _matrix(rng, q_dim, shape.n_embd)),
            ("attn_k.weight", _matrix(rng, kv_dim, shape.n_embd)),
            ("attn_v.weight", _matrix(rng, kv_dim, shape.n_embd)),
            ("attn_output.weight", _matrix(rng, shape.n_embd, q_dim)),
            ("ffn_norm.weight", _norm(rng, shape.n_embd)),
            ("ffn_gate.weight", _matrix(rng, shape.n_ff, shape.n_embd)),
            ("ffn_up.weight", _matrix(rng, shape.n_ff, shape.n_embd)),
            ("ffn_down.weight", _matrix(rng, shape.n_embd, shape.n_ff)),
        ]
        if arch == "qwen2":
            layer += [(f"attn_{x}.bias", _bias(rng, n)) for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
        if arch == "gemma3":
            layer += [
                ("attn_q_norm.weight", _norm(rng, shape.head_dim)),
                ("attn_k_norm.weight", _norm(rng, shape.head_dim)),
                ("post_attention_norm.weight", _norm(rng, shape.n_embd)),
                ("post_ffw_norm.weight", _norm(rng, shape.n_embd)),
            ]
        out += [(blk + name, data) for name, data in layer]
    return out  # no output.weight: both loaders tie the output to token_embd


def _add_hparams(w: GGUFWriter, arch: str, shape: Shape) -> None:
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if arch == "gemma3":
        w.add_sliding_window(N_SWA)
    else:
        w.add_rope_dimension_count(shape.head_dim)
        w.add_vocab_size(N_VOCAB)


def _add_tokenizer(w: GGUFWriter, chat_template: bool | str) -> None:
    tokens, scores, types = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)  # as Gemma's: " word" is "▁word", text at the start gets no space
    if chat_template:
        w.add_chat_template(chat_template if isinstance(chat_template, str) else CHAT_TEMPLATE)


def write_synthetic_gguf(path: str | Path, arch: str, seed: int = 0, chat_template: bool | str = False) -> Path:
    """Write the synthetic `arch` model to `path`; the same arguments always give the same bytes."""
    if arch not in SHAPES:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    path = Path(path)
    shape = SHAPES[arch]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch)
    w.add_name(f"synthetic {arch} seed {seed}")
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    _add_hparams(w, arch, shape)
    _add_tokenizer(w, chat_template)
    for name, data in _tensors(arch, shape, rng):
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCHS, required=True)
    ap.add_argument("-o", "--output", type=Path, required=True, help="GGUF file to write")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    ap.add_argument("--chat-template", action="store_true", help="also write a ChatML tokenizer.chat_template")
    args = ap.parse_args(argv)
    path = write_synthetic_gguf(args.output, args.arch, seed=args.seed, chat_template=args.chat_template)
    print(f"{path}: {args.arch}, seed {args.seed}, {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
