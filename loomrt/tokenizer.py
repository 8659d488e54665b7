"""Text tokenizers for `text` deployments: a `tokenizer.json`, or one rebuilt from a GGUF's metadata.

A GGUF carries no `tokenizer.json`, only llama.cpp's `tokenizer.ggml.*` keys: the model type
(`gpt2` = byte-level BPE), the pre-tokenizer name (`tokenizer.ggml.pre`), the vocabulary, the merges
and a type per token. `tokenizer_from_gguf` turns those into a `tokenizers.Tokenizer` directly: no
network, no transformers import (transformers is only the reference the tests compare against).
The metadata is read by the checkpoint reader (`loomrt.checkpoint_gguf.GgufCheckpoint.metadata`),
the one GGUF parser.

The pre-tokenizer is the one part the file does not spell out, only names. We follow llama.cpp's
table for the name (it is what wrote the name), which for `smollm` is "split every `\\p{N}` alone,
then the GPT-2 pattern" -- the same as SmolLM2's own `tokenizer.json`
(`Sequence[Digits(individual_digits), ByteLevel]`). transformers 5.x does not know `smollm` and
falls back to plain `ByteLevel`, which differs only where a whitespace run is followed by a digit
(`"x  1"`: we give `x, "ĠĠ", 1` as SmolLM2 was trained; it gives `x, Ġ, Ġ, 1`). A name we do not know
is refused rather than guessed.

`load_tokenizer` takes either kind of file; a GGUF's tokenizer is built once and kept as a
`tokenizer.json` under the loom cache, so later loads read one small file instead of parsing the
checkpoint's header (about half the time: ~0.13 s against ~0.3 s for SmolLM2), and the tokenizer a
deployment ran with is a file one can inspect.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from loomc.files import default_cache_dir, write_atomically

# Bump when the builder changes what it makes: cached tokenizer.json files are keyed on it.
BUILDER_VERSION = "1"

# llama.cpp's token types (`llama_token_type`); the others (NORMAL, UNKNOWN, UNUSED, BYTE) are
# plain vocabulary entries.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _byte_level(add_prefix_space: bool = False) -> pre_tokenizers.PreTokenizer:
    """GPT-2's pattern applied by `ByteLevel` itself (`use_regex`), then the byte spelling."""
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, trim_offsets=True, use_regex=True)


def _digits_then_byte_level(add_prefix_space: bool = False) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's `{"\\p{N}", gpt2 pattern}`: every digit alone, then GPT-2's split of the rest."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(add_prefix_space)])


# `tokenizer.ggml.pre` -> pre-tokenizer, for byte-level (`gpt2`) vocabularies. The names grouped
# here share one regex list in llama.cpp (`llama-vocab.cpp`); extend only with a reference check.
BYTE_LEVEL_PRE_TOKENIZERS: dict[str, Callable[[bool], pre_tokenizers.PreTokenizer]] = {
    "default": _byte_level,
    "gpt2": _byte_level,
    "gpt-2": _byte_level,
    "smollm": _digits_then_byte_level,
    "starcoder": _digits_then_byte_level,
    "refact": _digits_then_byte_level,
    "codeshell": _digits_then_byte_level,
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level vocabularies are spelled in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _read_metadata(path: Path, keys: tuple[str, ...]) -> dict[str, object]:
    """The named GGUF metadata values that are present (strings decoded, arrays as lists), read by
    the checkpoint reader (`loomrt.checkpoint_gguf`, which decodes only the values asked for).
    A file it cannot read is a `ValueError`, like every refusal here."""
    from loomrt.checkpoint_gguf import GgufCheckpoint  # noqa: PLC0415 - numpy and gguf only when building
    from loomrt.errors import CheckpointError  # noqa: PLC0415

    try:
        with GgufCheckpoint(path) as checkpoint:
            values = {key: checkpoint.metadata(key) for key in keys}
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    return {key: value for key, value in values.items() if value is not None}


_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type", "tokenizer.ggml.add_space_prefix",
)


def tokenizer_from_gguf(path: str | Path) -> Tokenizer:
    """A `tokenizers.Tokenizer` rebuilt from a GGUF's `tokenizer.ggml.*` metadata alone.

    Byte-level BPE (`tokenizer.ggml.model == "gpt2"`) with the pre-tokenizer llama.cpp uses for
    `tokenizer.ggml.pre`; tokens marked CONTROL become special added tokens and USER_DEFINED ones
    plain added tokens, so `<|im_start|>` written in text is one id, never cut into pieces. No
    post-processor: nothing (BOS/EOS) is added, the chat template writes its own. The decoder is
    `ByteLevel`. Other tokenizer models are refused (`ValueError`) rather than approximated."""
    meta = _read_metadata(Path(path), _TOKENIZER_KEYS)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre") or "default"
    make_pre = BYTE_LEVEL_PRE_TOKENIZERS.get(pre)  # type: ignore[arg-type]
    if make_pre is None:
        raise ValueError(f"{path}: tokenizer.ggml.pre {pre!r} is not a known byte-level pre-tokenizer "
                         f"(known: {sorted(BYTE_LEVEL_PRE_TOKENIZERS)})")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    if "tokenizer.ggml.merges" not in meta:
        raise ValueError(f"{path}: byte-level GGUF without tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]  # type: ignore[union-attr]
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))  # type: ignore[call-overload]

    # Every real entry of a byte-level vocabulary is spelled in the byte alphabet; one that is not
    # (an added token written as plain text) is respelled so the BPE model can hold it.
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    if len(vocab) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.tokens has duplicate entries")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = make_pre(bool(meta.get("tokenizer.ggml.add_space_prefix", False)))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = None

    # A CONTROL token outside the byte alphabet is a known llama.cpp mislabel; adding it would grow
    # the vocabulary past the model's, so (as transformers does) it is left alone.
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL and set(t) <= alphabet]
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED and t in vocab]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError(f"{path}: added tokens grew the vocabulary to {tok.get_vocab_size()} "
                         f"(the file has {len(tokens)})")
    return tok


def chat_template_of(path: str | Path) -> str | None:
    """The GGUF's `tokenizer.chat_template` (Jinja), or None: what the file says a conversation
    looks like, for tests and docs to render prompts the model was tuned on."""
    value = _read_metadata(Path(path), ("tokenizer.chat_template",)).get("tokenizer.chat_template")
    return value if isinstance(value, str) else None


def cache_path_for(path: str | Path, cache_dir: Path | None = None) -> Path:
    """Where `load_tokenizer` keeps the tokenizer built from the GGUF at `path`.

    Keyed on the file's resolved path, size and mtime (and `BUILDER_VERSION`), not on its
    contents: hashing the metadata would mean parsing it, the work the cache exists to save.
    `cache_dir` is the loom cache root, the kernel cache's too (default `loomc.files.default_cache_dir()`:
    `$LOOM_CACHE_DIR`, else `~/.cache/loom`)."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{BUILDER_VERSION}".encode()
    return (cache_dir or default_cache_dir()) / "tokenizers" / f"{hashlib.sha256(key).hexdigest()}.json"


def unpadded(tok: Tokenizer) -> Tokenizer:
    """A tokenizer.json may carry padding and truncation settings for training (all-MiniLM's pads
    to 128). Policies decide lengths themselves: `tokenize` returns exactly the text's ids."""
    tok.no_padding()
    tok.no_truncation()
    return tok


def _is_inventory(path: Path) -> bool:
    from loomrt.phonemizer import is_phoneme_inventory

    try:
        return is_phoneme_inventory(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return False     # Tokenizer.from_file reports what is wrong with it


def load_tokenizer(path: str | Path, cache_dir: Path | None = None) -> Tokenizer:
    """The tokenizer a deployment names: a `.json` file is a `tokenizer.json` and is read as
    is, or a speech model's phoneme inventory (`loomrt.phonemizer`); a `.gguf` is built from its metadata (`tokenizer_from_gguf`) and saved under
    `<cache>/tokenizers/<sha256>.json` with its content's sha256 in `<sha256>.json.sha256`; later
    loads reuse it instead of rebuilding. An entry whose bytes do not match that digest, or that
    does not load, is rebuilt and replaced, never used."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        if _is_inventory(path):
            from loomrt.phonemizer import load_phonemizer   # a speech model's phonemes (docs/tokenizers.md)
            return load_phonemizer(path)
        return unpadded(Tokenizer.from_file(str(path)))
    if suffix != ".gguf":
        raise ValueError(f"{path}: a tokenizer is a tokenizer.json (.json) or a GGUF checkpoint (.gguf)")
    cached = cache_path_for(path, cache_dir)
    tok = _read_cached(cached)
    if tok is not None:
        return tok
    tok = tokenizer_from_gguf(path)
    data = tok.to_str().encode("utf-8")
    # The entry first, then its digest: a crash between the two leaves a digest that does not
    # match, so the next load rebuilds. Each write is atomic (a concurrent loader never reads half a file).
    write_atomically(cached, data, parents=True)
    write_atomically(_digest_path(cached), hashlib.sha256(data).hexdigest() + "\n")
    return tok


def _digest_path(cached: Path) -> Path:
    return cached.with_name(cached.name + ".sha256")


def _read_cached(cached: Path) -> Tokenizer | None:
    """The cached tokenizer, or None when the entry is missing, its bytes do not match the
    sha256 saved beside it (truncated or damaged, as by a crash or a full disk: a damaged
    entry that still parses would tokenize wrongly), or it does not load."""
    try:
        data = cached.read_bytes()
        digest = _digest_path(cached).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception:  # noqa: BLE001 - an entry that does not load is rebuilt, not fatal
        return None


__all__ = ["BUILDER_VERSION", "BYTE_LEVEL_PRE_TOKENIZERS", "cache_path_for", "chat_template_of", "load_tokenizer",
           "tokenizer_from_gguf"]
