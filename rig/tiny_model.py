"""A tiny random-weight Llama and a tiny tokenizer, made locally (no hub is reachable).

head_dim must be >= 32 for the CPU attention backend; the config below has head_dim 32.
The tokenizer is a per-character WordLevel model over the 512-id vocab, enough for text prompts
and structured output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VOCAB = 512
CONFIG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
VERSION = 1  # bump when the model or tokenizer recipe changes; the cache key follows


def default_dir() -> Path:
    """$VLLM_CONTRACT_CACHE (the Makefile and tests set it to the checkout's .cache/), else
    ~/.cache/vllm-contract."""
    base = os.environ.get("VLLM_CONTRACT_CACHE") or Path.home() / ".cache" / "vllm-contract"
    return Path(base) / f"tiny-llama-v{VERSION}"


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    chars = [chr(c) for c in range(32, 127)]
    filler = [f"<t{i}>" for i in range(VOCAB - len(specials) - len(chars))]
    vocab = {tok: i for i, tok in enumerate(specials + chars + filler)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(out)


def build_cached(out: Path, make_model, done: dict) -> Path:
    """`make_model()` (a transformers model, random weights after torch.manual_seed(0)) saved
    in bf16 with the tiny tokenizer into `out`, once: `done` is written beside it last, and a
    later call finds it there. A build that died half-way is built again; two processes
    building at once each build in a folder of their own, and the first rename wins."""
    if (out / "done.json").exists():
        return out
    import shutil

    import torch

    if out.exists():  # a build that died half-way
        shutil.rmtree(out, ignore_errors=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    make_model().to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tmp)
    (tmp / "done.json").write_text(json.dumps(done))
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race; theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build(out: Path | None = None) -> Path:
    """Build the model (and tokenizer) into `out` once; later calls return the cached copy."""
    def make():
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**CONFIG, bos_token_id=1, eos_token_id=2,
                                            torch_dtype="bfloat16"))

    return build_cached(Path(out) if out else default_dir(), make,
                        {"version": VERSION, **CONFIG})


if __name__ == "__main__":
    print(build())
