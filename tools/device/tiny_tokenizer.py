"""Give a tiny random-weight model a tokenizer, so that text-speaking clients can be pointed at it.

    python3 tools/device/tiny_tokenizer.py SRC DEST

Copies the model folder SRC to DEST and adds a word-level tokenizer with one word per id
(`<s>` 0 and `</s>` 1 as in the tiny models' config, then `w2` .. `w<vocab-1>`, split on spaces).
Decoding any id sequence gives text and encoding that text gives the ids back, so SGLang's
detokenizer streams text and `sglang.bench_serving` can count it. The weights are untouched: the
model computes exactly what it does without a tokenizer (cptest sends `input_ids` either way).
Runs on the GPU machine with the bundle's `tokenizers` (0.22.2) and `transformers` (5.12.1).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def main(src: Path, dest: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab_size = int(json.loads((src / "config.json").read_text())["vocab_size"])
    shutil.copytree(src, dest, dirs_exist_ok=True)
    vocab = {"<s>": 0, "</s>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "</s>", "model_max_length": 8192, "add_bos_token": False,
        "clean_up_tokenization_spaces": False}, indent=1) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "</s>"}) + "\n")
    print(f"{dest}: word-level tokenizer, {vocab_size} ids")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
