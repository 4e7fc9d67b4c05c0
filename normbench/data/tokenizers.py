"""Tokenizers for ``normbench prepare``: char, byte, byte-level BPE, any tokenizer.json, tiktoken.

Each one turns a batch of texts into arrays of ids, knows its vocabulary size and its end-of-text
id (the separator written between documents), saves what decodes it beside the shards, and
decodes ids back to text. The specs a user writes:

- ``char``: one id per distinct character of the corpus (sorted), the end-of-text id after them;
- ``byte``: the 256 byte values, end-of-text 256;
- ``bpe:N``: a byte-level BPE of N tokens (end-of-text included) trained on the corpus with
  Hugging Face ``tokenizers``, saved as ``tokenizer.json``;
- a path to a ``tokenizer.json``: used as it is (an end-of-text token is added if it has none);
- ``tiktoken:NAME``: OpenAI's tiktoken encodings (gpt2, cl100k_base, ...) when tiktoken and its
  BPE file are present; offline without the file it fails in one line.

``build_tokenizer`` builds the one a spec names, learning from the sources where it must (char, bpe).
The BPE and tiktoken encoders run on every core (Rust / native threads); char and byte are numpy.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from normbench.core.errors import ConfigError, first_line
from normbench.data.sources import Source, all_documents, labelled

EOT = "<|endoftext|>"
# End-of-text tokens of common tokenizer.json files (GPT-2, LLaMA-3, SentencePiece-style), in order.
EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")
TOKENIZER_FILE = "tokenizer.json"
SPECS = ["char", "byte", "bpe:N (N >= 257)", "a path to a tokenizer.json", "tiktoken:NAME"]


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


class CharTokenizer:
    """One id per character of the corpus; decoding is indexing the character list."""

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        self.codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype="<u4")
        self.eot_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1
        self.spec = "char"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for text in texts:
            cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
            ids = np.minimum(np.searchsorted(self.codepoints, cps), len(self.codepoints) - 1)
            bad = self.codepoints[ids] != cps
            if bad.any():
                raise ConfigError(
                    f"character {chr(int(cps[bad.argmax()]))!r} is not in the char vocabulary "
                    "(built from the sources and --val together)"
                )
            out.append(ids.astype(np.uint32))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] if i != self.eot_id else EOT for i in ids)

    def save(self, directory: Path) -> dict:
        return {"spec": "char", "chars": self.chars, "sha256": _sha256(self.chars)}


class ByteTokenizer:
    """The UTF-8 bytes of the text; end-of-text is 256."""

    spec, vocab_size, eot_id = "byte", 257, 256

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint32) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        parts, start = [], 0
        for i, t in enumerate([*ids, self.eot_id]):
            if t == self.eot_id:
                parts.append(bytes(ids[start:i]).decode("utf-8", errors="replace"))
                start = i + 1
        return EOT.join(parts)

    def save(self, directory: Path) -> dict:
        return {"spec": "byte", "sha256": _sha256("byte")}


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer``: trained here (bpe:N) or read from a tokenizer.json."""

    def __init__(self, tokenizer, spec: str):
        self.tok, self.spec = tokenizer, spec
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        name = next((n for n in EOT_NAMES if n in vocab), None)
        if name is None:  # a tokenizer without one: add ours (the saved copy has it)
            tokenizer.add_special_tokens([EOT])
            name = EOT
        self.eot_id = tokenizer.token_to_id(name)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # The fast batch path (no offsets), parallel in Rust; no template tokens (BOS) added.
        return [
            np.asarray(e.ids, dtype=np.uint32)
            for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)
        ]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(map(int, ids)), skip_special_tokens=False)

    def save(self, directory: Path) -> dict:
        path = Path(directory) / TOKENIZER_FILE
        self.tok.save(str(path))
        return {"spec": self.spec, "file": TOKENIZER_FILE, "sha256": _sha256(path.read_bytes())}


class TiktokenTokenizer:
    """An OpenAI tiktoken encoding; its end-of-text token separates documents."""

    def __init__(self, name: str):
        try:
            import tiktoken
        except ImportError:
            raise ConfigError("tiktoken:NAME needs tiktoken: pip install 'normbench[tiktoken]'") from None
        try:
            self.enc = tiktoken.get_encoding(name)
        except ValueError as err:  # an unknown name
            raise ConfigError(f"tiktoken:{name}: {err}", allowed=tiktoken.list_encoding_names()) from None
        except Exception as err:  # its BPE file could not be fetched (offline)
            raise ConfigError(
                f"tiktoken:{name}: its BPE file is not cached and could not be downloaded "
                f"({type(err).__name__}); offline, put the file in TIKTOKEN_CACHE_DIR, "
                "or use bpe:N or a tokenizer.json"
            ) from None
        self.spec, self.name = f"tiktoken:{name}", name
        self.eot_id, self.vocab_size = self.enc.eot_token, self.enc.n_vocab

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)
        return [np.asarray(i, dtype=np.uint32) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(map(int, ids)))

    def save(self, directory: Path) -> dict:
        return {"spec": self.spec, "sha256": _sha256(self.spec)}


def parse_spec(spec: str) -> tuple[str, str | int | Path | None]:
    """``spec`` as (kind, argument), checked: kind is char, byte, bpe, json or tiktoken."""
    spec = spec.strip()
    if spec in ("char", "byte"):
        return spec, None
    if spec.startswith("bpe:"):
        try:
            n = int(spec[4:])
        except ValueError:
            raise ConfigError(
                f"tokenizer {spec!r}: N must be an integer, e.g. bpe:4096", allowed=SPECS
            ) from None
        if n < 257:
            raise ConfigError(
                f"tokenizer {spec}: a byte-level BPE needs N >= 257 "
                "(256 byte tokens and the end-of-text token)",
                allowed=SPECS,
            )
        return "bpe", n
    if spec.startswith("tiktoken:"):
        return "tiktoken", spec[len("tiktoken:") :]
    path = Path(os.path.expanduser(spec))
    if path.is_dir() and (path / TOKENIZER_FILE).is_file():
        path = path / TOKENIZER_FILE
    if path.is_file():
        return "json", path.resolve()
    raise ConfigError(f"unknown tokenizer {spec!r} (not a spec, and no such tokenizer.json)", allowed=SPECS)


def load_json(path: Path) -> HFTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a malformed file
        raise ConfigError(
            f"{path}: not a Hugging Face tokenizer.json ({first_line(err, named=False)})"
        ) from None
    return HFTokenizer(tok, str(path))


def train_bpe(n: int, texts: Iterable[str]) -> HFTokenizer:
    """A byte-level BPE of ``n`` tokens (end-of-text included) trained on ``texts``, as GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    got = tok.get_vocab_size(with_added_tokens=True)
    if got < n:
        raise ConfigError(
            f"tokenizer bpe:{n}: the corpus supports only {got} tokens (no pair left to merge); "
            f"use bpe:{got} or fewer, or more text"
        )
    return HFTokenizer(tok, f"bpe:{n}")


def from_meta(directory: Path) -> CharTokenizer | ByteTokenizer | HFTokenizer | TiktokenTokenizer:
    """The tokenizer that wrote the shards in ``directory`` (its meta.json), to decode them."""
    meta = json.loads((Path(directory) / "meta.json").read_text())["tokenizer"]
    if meta["spec"] == "char":
        return CharTokenizer(meta["chars"])
    if meta["spec"] == "byte":
        return ByteTokenizer()
    if meta["spec"].startswith("tiktoken:"):
        return TiktokenTokenizer(meta["spec"].split(":", 1)[1])
    tok = load_json(Path(directory) / meta["file"])
    tok.spec = meta["spec"]
    return tok


def build_tokenizer(opts, train: list[Source], val: list[Source]):
    """The tokenizer ``opts.tokenizer`` names (the prepare options), built on ``train`` and ``val``
    where it learns from the corpus."""
    kind, arg = parse_spec(opts.tokenizer)
    if kind == "char":
        chars = set()
        for text, _ in all_documents([*train, *val], opts):
            chars.update(text)
        return CharTokenizer("".join(chars))
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        # Trained on the training split alone: the held-out documents stay unseen.
        return train_bpe(arg, (text for split, text, _ in labelled(train, val, opts) if split == "train"))
    if kind == "json":
        return load_json(arg)
    return TiktokenTokenizer(arg)
