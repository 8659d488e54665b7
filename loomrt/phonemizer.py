"""A speech deployment's text front end: text -> phonemes (hibari's G2P) -> ids (the voice's inventory).

A speech model reads phonemes, not text. Its document names a phoneme inventory as its
`tokenizer`: a JSON object mapping each phoneme symbol (one character) to its id, as
`hibari/assets/vocab.json` is. Loom turns text into phonemes with hibari's G2P
(`hibari.g2p`, American English: normalisation, tokenizer, tagger, lexicon), a library as
`tokenizers` is for text models, and the phonemes into ids by the inventory; symbols the
inventory lacks are dropped, as hibari does. The object quacks like a `tokenizers.Tokenizer`
where the control program needs it (`tokenize`/`detokenize` host calls, the vocabulary size).

Words the lexicon cannot read go to `fallback` (a callable word -> phonemes or None). The
G2P's own fallback is an onnxruntime network, which serving never loads: a speech deployment
supplies its own (a `phonemizer` component, attached by `loomrt.services.speech`); without
one such words are skipped (spoken as nothing).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MAX_TEXT_CHARS = 1 << 20     # one call at most (the /tokenize bound; policies cut far shorter blocks)


@dataclass(frozen=True)
class Encoding:
    ids: list[int]
    phonemes: str


def is_phoneme_inventory(doc: Any) -> bool:
    """A JSON document that is an inventory: one-character symbols to distinct non-negative ids."""
    return (isinstance(doc, dict) and bool(doc)
            and all(isinstance(k, str) and len(k) == 1 for k in doc)
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 16 for v in doc.values())
            and len(set(doc.values())) == len(doc))


class Phonemizer:
    def __init__(self, inventory: dict[str, int], fallback: Callable[[str], str | None] | None = None):
        from hibari.g2p import G2P      # the sample weights' package (installed --no-deps); pure Python

        self.inventory = dict(inventory)
        self.symbols = {i: s for s, i in self.inventory.items()}
        self.fallback = fallback
        self._g2p = G2P(oov=self._unknown_word)
        self._lock = threading.Lock()   # the G2P keeps per-call state: one caller at a time

    def _unknown_word(self, word: str) -> str | None:
        return None if self.fallback is None else self.fallback(word)

    def phonemes(self, text: str) -> str:
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text of {len(text)} characters (at most {MAX_TEXT_CHARS} per call)")
        with self._lock:
            return self._g2p(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        phonemes = self.phonemes(text)
        return Encoding([self.inventory[c] for c in phonemes if c in self.inventory], phonemes)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.symbols.get(i, "") for i in ids)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return max(self.inventory.values()) + 1


def load_phonemizer(path: str | Path) -> Phonemizer:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not is_phoneme_inventory(doc):
        raise ValueError(f"{path}: a phoneme inventory maps one-character symbols to distinct ids")
    return Phonemizer(doc)


__all__ = ["Encoding", "Phonemizer", "is_phoneme_inventory", "load_phonemizer"]
