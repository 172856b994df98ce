"""Build a tiny randomly initialised Llama and its tokenizer locally (no downloads).

Run by the engine venv's Python: ``python build_tiny_model.py OUT_DIR [--hidden 512 --layers 4 --heads 8]``.
The tokenizer is a 2,048-token byte-level BPE trained on the standard library's
``.py`` files; outputs are random text, which is all latency work needs. vLLM's
CPU attention supports head sizes 32, 64, 80, ... 512 only (16 kills the engine
at its first request), so ``hidden / heads`` must be one of those.
"""

from __future__ import annotations

import argparse
import glob
import os
import sysconfig


def main() -> None:
    """Write the tokenizer and model to ``OUT_DIR``; prints the parameter count."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--max-positions", type=int, default=4096)
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:120]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=args.max_positions,
    )
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    fast.save_pretrained(args.out)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.max_positions,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(args.out)
    model.generation_config.save_pretrained(args.out)
    print("params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
