#!/usr/bin/env python3
"""Train Strata's demo models from scratch: a byte-level BPE tokenizer and a small OLMoE (`--arch olmoe`, the
embedded demo, models/demo), or a small DeepSeek-V3 with its multi-token-prediction layer (`--arch deepseek_v3`,
target/demo-mtp: the pair speculative decoding drafts with), on the same text with the embedded demo's tokenizer.

Run through `cargo xtask train-demo [--mtp]` (which creates the pinned venv and installs the text), or directly:

    python xtask/train_demo/train.py --out models/demo --work target/train-demo
    python xtask/train_demo/train.py --arch deepseek_v3      # target/demo-mtp, work in target/train-demo-mtp

The MTP pair is DeepSeek-V3's: the main model's last hidden state at position i (after its final norm) and the
embedding of token i + 1 go through `enorm`/`hnorm`, `eh_proj` and one MoE decoder layer, then `shared_head.norm` and
the main model's lm head, to predict token i + 2 (transformers' `MtpModel`). Both are trained jointly on the main
loss plus the DeepSeek-V3 report's MTP loss times lambda (`--mtp-lambda`), and the routers balance their experts as
DeepSeek-V3's do, without an auxiliary loss: after each step every router's score-correction bias moves by
`--bias-update-speed` towards its under-used experts. The MTP layer is written in DeepSeek's hub layout (decoder
layer `num_hidden_layers`, `model.layers.{N}.*`) by xtask/fixtures/mtp_ref.py's `hub_tensors`, and the written
checkpoint is read back and checked through its `load_mtp` and `draft_logits`.

Text: the English fortune-cookie files of Debian's `fortunes` and `fortunes-min` packages
(BSD licence, /usr/share/doc/fortunes/copyright), read from /usr/share/games/fortunes.
Nothing is downloaded.

Deterministic given --seed and --threads (the float reductions of torch's CPU kernels depend on the
thread count): the same command writes the same tokenizer and, step for step, the same weights.
Interrupted runs resume from the last checkpoint in --work (rerun the same command).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

# The DeepSeek-V3 MTP layer's hub layout and reference forward, shared with the fixtures.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))

PINNED = {"torch": "2.15.0", "transformers": "5.23.0", "tokenizers": "0.23.3"}

FORTUNES_DIR = "/usr/share/games/fortunes"
# Files of the English `fortunes`/`fortunes-min` packages left out: pictures and Latin.
EXCLUDED_FILES = {"ascii-art", "translate-me"}

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
EOT, SYSTEM, USER, ASSISTANT, END = SPECIAL_TOKENS

# Renders `<|role|>\ncontent<|end|>\n` per message; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] | trim + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

GENERIC_PROMPTS = [
    "Tell me a fortune.", "Tell me something.", "Say something.", "Say something interesting.",
    "Give me a quote.", "Tell me a joke.", "Hello!", "Hi.", "Hi there!", "Hello, how are you?",
    "What's on your mind?", "Cheer me up.", "Any advice for me?", "What is the meaning of life?",
    "Tell me something I don't know.", "Share a thought.", "I'm bored.", "Make me laugh.",
    "Say something wise.", "What should I know today?", "Talk to me.", "Good morning!",
    "How are you?", "What do you think?", "Tell me a story.", "Can you give me some advice?",
    "Tell me something funny.", "What's new?", "Teach me something.", "Inspire me.",
    "Do you have a thought for the day?", "What's my fortune?",
]
TOPIC_PROMPTS = [
    "Tell me something about {t}.", "Say something about {t}.", "Give me a quote about {t}.",
    "What do you think about {t}?", "Any thoughts on {t}?", "Tell me a joke about {t}.",
    "What can you tell me about {t}?",
]
TOPICS = {
    "art": "art", "computers": "computers", "drugs": "drugs", "education": "school", "food": "food",
    "goedel": "logic", "kids": "kids", "law": "the law", "linux": "Linux", "linuxcookie": "Linux",
    "literature": "books", "love": "love", "magic": "magic", "medicine": "medicine",
    "men-women": "men and women", "news": "the news", "paradoxum": "paradoxes", "people": "people",
    "perl": "Perl", "pets": "pets", "platitudes": "life", "politics": "politics", "science": "science",
    "sports": "sports", "startrek": "Star Trek", "tao": "the Tao", "wisdom": "wisdom", "work": "work",
    "debian": "Debian", "humorists": "humor", "songs-poems": "poetry",
}
EXTRA_PROMPTS = {
    "riddles": ["Tell me a riddle.", "Do you know a riddle?"],
    "songs-poems": ["Tell me a poem.", "Sing me a song.", "Recite a poem."],
    "humorists": ["Tell me something funny.", "Make me laugh."],
    "wisdom": ["Say something wise.", "Share some wisdom."],
    "definitions": ["Define a word for me.", "Give me a definition."],
    "startrek": ["Quote Star Trek."],
}
SYSTEM_PROMPTS = [
    "You are a fortune cookie.", "You are a helpful assistant.", "You are a witty assistant.",
    "Answer with a quotation.", "You are a wise old sage.",
]
ATTRIBUTION_PROMPTS = [
    "Give me a quote by {n}.", "What did {n} say?", "Quote {n}.", "Tell me something {n} said.",
]


# ----------------------------------------------------------------------------------------------- text


def clean(text: str) -> str:
    """Drop overstriking (`_\\bx`), tabs and ragged spacing; keep line breaks."""
    text = re.sub(r".\x08", "", text)
    text = text.replace("\x08", "").replace("\r", "")
    # Undo the hard wrapping at ~72 columns: a long line followed by an unindented line that is no
    # attribution or speaker label continues the same paragraph.
    joined: list[str] = []
    for ln in text.split("\n"):
        prev = joined[-1].rstrip() if joined else ""
        if (len(prev) >= 50 and ln[:1] not in ("", " ", "\t", "<", "[", "*", ">") and not ln.startswith("--")
                and not re.match(r"^[A-Z][\w .'-]{0,20}:", ln)):
            joined[-1] = prev + " " + ln
        else:
            joined.append(ln)
    lines = [re.sub(r"[ \t\f\v]+", " ", ln).strip() for ln in joined]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def looks_like_prose(text: str) -> bool:
    if len(text) < 8 or len(text) > 2000:
        return False
    letters = sum(c.isalpha() for c in text)
    spaces = text.count(" ")
    if letters < 0.6 * len(text.replace(" ", "").replace("\n", "")):
        return False  # ASCII art, tables, code dumps
    return spaces >= 1


def load_fortunes(root: Path) -> list[tuple[str, str]]:
    """(file name, cleaned fortune) for every fortune, in a fixed order, exact duplicates removed."""
    if not root.is_dir():
        raise SystemExit(f"{root} does not exist: install Debian's `fortunes` package (apt-get install fortunes)")
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    files = sorted(
        p for p in root.iterdir()
        if p.is_file() and not p.is_symlink() and "." not in p.name and p.name not in EXCLUDED_FILES
    )
    for path in files:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        for chunk in re.split(r"^%[ \t]*$", text, flags=re.M):
            body = clean(chunk)
            if not looks_like_prose(body) or body in seen:
                continue
            seen.add(body)
            out.append((path.name, body))
    if not out:
        raise SystemExit(f"no fortunes found in {root}")
    return out


def attribution(body: str) -> str | None:
    last = body.rsplit("\n", 1)[-1]
    m = re.match(r"^-- ?([A-Z][A-Za-z.'\- ]{2,40}?)(?:,|$)", last)
    return m.group(1).strip() if m else None


def question_answer(body: str) -> tuple[str, str] | None:
    m = re.match(r"^Q:\s*(.+?)\nA:\s*(.+)$", body, flags=re.S)
    if m and len(m.group(1)) < 200:
        return m.group(1).strip(), m.group(2).strip()
    return None


def user_prompt(rng: random.Random, cat: str, body: str) -> str:
    name = attribution(body)
    if name and rng.random() < 0.35:
        return rng.choice(ATTRIBUTION_PROMPTS).format(n=name)
    if cat in EXTRA_PROMPTS and rng.random() < 0.5:
        return rng.choice(EXTRA_PROMPTS[cat])
    if cat in TOPICS and rng.random() < 0.5:
        return rng.choice(TOPIC_PROMPTS).format(t=TOPICS[cat])
    return rng.choice(GENERIC_PROMPTS)


def render(messages: list[dict[str, str]]) -> str:
    """Python twin of CHAT_TEMPLATE (checked against transformers' rendering in `export`)."""
    return "".join(f"<|{m['role']}|>\n{m['content'].strip()}{END}\n" for m in messages)


def chat_document(rng: random.Random, items: list[tuple[str, str]]) -> str:
    messages: list[dict[str, str]] = []
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for cat, body in items:
        qa = question_answer(body)
        if qa:
            messages += [{"role": "user", "content": qa[0]}, {"role": "assistant", "content": qa[1]}]
        else:
            messages += [{"role": "user", "content": user_prompt(rng, cat, body)},
                         {"role": "assistant", "content": body}]
    return render(messages)


def epoch_documents(items: list[tuple[str, str]], seed: int, epoch: int, chat_fraction: float) -> list[str]:
    """All training fortunes in a fresh order; about `chat_fraction` of them inside chat turns
    (a sixth of the conversations have two exchanges). Each document ends with <|endoftext|>."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(items)))
    rng.shuffle(order)
    docs: list[str] = []
    i = 0
    while i < len(order):
        if rng.random() < chat_fraction:
            n = 2 if (rng.random() < 1 / 6 and i + 1 < len(order)) else 1
            docs.append(chat_document(rng, [items[j] for j in order[i:i + n]]) + EOT)
            i += n
        else:
            docs.append(items[order[i]][1] + "\n" + EOT)
            i += 1
    return docs


# ------------------------------------------------------------------------------------------ tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Teach the merges the chat scaffolding too (role names, newlines after turns).
    scaffold = [render([{"role": "user", "content": p}]) for p in GENERIC_PROMPTS] * 20
    tok.train_from_iterator(texts + scaffold, trainer=trainer)
    return tok


def encode_docs(tok: Tokenizer, docs: list[str]) -> list[int]:
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
    return ids


# ---------------------------------------------------------------------------------------------- model


def model_config(args, vocab_size: int, special: dict[str, int]):
    from transformers import DeepseekV3Config, OlmoeConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=args.seq,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.02,
        tie_word_embeddings=args.tie,
        use_cache=True,
        pad_token_id=special[EOT],
        bos_token_id=special[EOT],
        eos_token_id=[special[END], special[EOT]],
    )
    if args.arch == "olmoe":
        return OlmoeConfig(
            **common,
            intermediate_size=args.expert_intermediate,
            num_experts=args.experts,
            norm_topk_prob=False,
            rms_norm_eps=1e-5,
            router_aux_loss_coef=args.aux_coef,
            output_router_logits=False,
        )
    # DeepSeek-V3's shape at a tiny scale: MLA with a query latent, the first layer dense, then MoE layers with a
    # shared expert and the sigmoid group-limited router, and one MTP layer.
    return DeepseekV3Config(
        **common,
        intermediate_size=args.dense_intermediate,
        moe_intermediate_size=args.expert_intermediate,
        n_routed_experts=args.experts,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        rope_interleave=True,
        rms_norm_eps=1e-6,
        num_nextn_predict_layers=1,
    )


def build_model(cfg, seed: int) -> torch.nn.Module:
    """What is trained: the OLMoE, or the DeepSeek-V3 and its MTP layer as `{"model", "mtp"}`."""
    from transformers import DeepseekV3ForCausalLM, OlmoeForCausalLM
    from transformers.modeling_layers import MtpModel

    torch.manual_seed(seed)
    # Sort tokens by expert and run one matmul per expert (transformers' grouped_mm path; on CPU a loop).
    cfg._experts_implementation = "grouped_mm"
    if cfg.model_type == "olmoe":
        return OlmoeForCausalLM(cfg)
    model = DeepseekV3ForCausalLM(cfg)
    mtp = MtpModel(model, cfg.num_nextn_predict_layers)
    # MtpModel's generic initialisation leaves the router and expert tensors of its block as allocated: start
    # the layer as the stack's layers start (norms 1, every other weight N(0, initializer_range), no bias).
    with torch.no_grad():
        for name, param in mtp.layers.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, cfg.initializer_range)
        for name, buffer in mtp.layers.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()
    return torch.nn.ModuleDict({"model": model, "mtp": mtp})


def main_model(trained: torch.nn.Module):
    """The causal LM of what is trained (the MTP layer aside)."""
    return trained["model"] if isinstance(trained, torch.nn.ModuleDict) else trained


def losses(trained: torch.nn.Module, x: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(next-token loss, side loss, the loss to minimise): the side loss is OLMoE's load-balancing auxiliary loss
    (weighted by --aux-coef), or the MTP layer's loss on token i + 2 (weighted by --mtp-lambda)."""
    vocab = main_model(trained).config.vocab_size
    ce = torch.nn.functional.cross_entropy
    if not isinstance(trained, torch.nn.ModuleDict):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            outp = trained(input_ids=x[:, :-1], output_router_logits=True)
        lm_loss = ce(outp.logits.reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
        aux = outp.aux_loss.float() if outp.aux_loss is not None else torch.zeros(())
        return lm_loss, aux, lm_loss + args.aux_coef * aux
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
        logits, drafted = pair_logits(trained, x[:, :-1])
    lm_loss = ce(logits.reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
    mtp_loss = ce(drafted.reshape(-1, vocab).float(), x[:, 2:].reshape(-1))
    return lm_loss, mtp_loss, lm_loss + args.mtp_lambda * mtp_loss


def pair_logits(trained: torch.nn.ModuleDict, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced logits of the main model at every position of `ids` and of the MTP layer at positions
    1..n-1 (row i drafts token i + 2 from the main model's last hidden state at i and token i + 1), as
    mtp_ref.draft_logits computes them."""
    model, mtp = trained["model"], trained["mtp"]
    hidden = model.model(input_ids=ids).last_hidden_state
    n = ids.shape[1]
    positions = torch.arange(1, n).expand(ids.shape[0], -1)
    drafted = mtp.forward_layer(0, hidden[:, : n - 1], position_ids=positions, mtp_cache=None, input_ids=ids[:, 1:])
    return model.lm_head(hidden), mtp._project_to_logits(drafted)


class Balancer:
    """DeepSeek-V3's auxiliary-loss-free load balancing: every router counts the tokens each expert takes in the
    training forward passes, and after each optimizer step its score-correction bias (which only chooses experts,
    never weighs them) moves by `speed` up for the experts that took fewer than the mean, down for the others."""

    def __init__(self, trained: torch.nn.Module, speed: float):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

        self.speed = speed
        self.routers = [m for m in trained.modules() if isinstance(m, DeepseekV3TopkRouter)]
        self.loads = [torch.zeros(r.num_experts) for r in self.routers]
        for router, load in zip(self.routers, self.loads):
            router.register_forward_hook(self._counter(load))

    @staticmethod
    def _counter(load: torch.Tensor):
        def count(module, _inputs, outputs) -> None:
            if module.training:
                load.add_(torch.bincount(outputs[2].reshape(-1), minlength=load.numel()).float())

        return count

    def step(self) -> float:
        """Moves the biases; returns the busiest expert's load over the mean, averaged over the routers."""
        imbalance = 0.0
        with torch.no_grad():
            for router, load in zip(self.routers, self.loads):
                router.e_score_correction_bias.add_(self.speed * torch.sign(load.mean() - load))
                imbalance += float(load.max() / load.mean().clamp(min=1e-9))
                load.zero_()
        return imbalance / max(1, len(self.routers))


def windows(ids: list[int], seq: int) -> torch.Tensor:
    n = (len(ids) - 1) // seq
    t = torch.tensor(ids[: n * seq + 1], dtype=torch.long)
    x = torch.stack([t[i * seq:(i + 1) * seq + 1] for i in range(n)])
    return x


@torch.no_grad()
def evaluate(model, data: torch.Tensor, batch: int, autocast: bool = False) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, data.shape[0], batch):
        x = data[i:i + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


@torch.no_grad()
def evaluate_mtp(trained: torch.nn.ModuleDict, data: torch.Tensor, batch: int, autocast: bool = False):
    """The main model's loss, the MTP layer's loss on token i + 2, and how often its draft is the main model's own
    next-token argmax there (teacher-forced on the text: what a greedy verify pass would accept of a first draft)."""
    trained.eval()
    main, total, agree, count = 0.0, 0.0, 0, 0
    for i in range(0, data.shape[0], batch):
        x = data[i:i + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, drafted = pair_logits(trained, x[:, :-1])
        main += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1), reduction="sum").item()
        total += torch.nn.functional.cross_entropy(
            drafted.reshape(-1, drafted.shape[-1]).float(), x[:, 2:].reshape(-1), reduction="sum").item()
        agree += int((drafted.argmax(-1) == logits[:, 1:].argmax(-1)).sum())
        count += x[:, 2:].numel()
    trained.train()
    # The main model predicts one token more a window than the MTP layer.
    return main / (count + data.shape[0]), total / count, agree / count


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


# ------------------------------------------------------------------------------------------------ main


class Log:
    def __init__(self, path: Path, append: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a" if append else "w", encoding="utf-8")

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.f.write(msg + "\n")
        self.f.flush()


# Each architecture's defaults (an argument given on the command line wins).
ARCH_DEFAULTS = {
    # The embedded demo, models/demo: 14.7 M parameters, about 50 minutes on one core.
    "olmoe": dict(out="models/demo", work="target/train-demo", layers=4, experts=32, expert_intermediate=128,
                  tie=True, steps=1800, warmup=150, autocast=True, tokenizer_from=None),
    # The MTP pair, target/demo-mtp: three layers (the first dense) and the MTP layer, 64 routed experts per MoE
    # layer (so that a quarter or a tenth of them cached is a real streaming case), untied as DeepSeek-V3 is;
    # the embedded demo's tokenizer. About 20 minutes on one core. In float32: on a CPU without bf16 arithmetic
    # (AVX512-BF16 or AMX) bf16 autocast made a step of it 10 times slower (3.4 s forward and 19 s backward,
    # against 0.9 s and 1.4 s).
    "deepseek_v3": dict(out="target/demo-mtp", work="target/train-demo-mtp", layers=3, experts=64,
                        expert_intermediate=64, tie=False, steps=500, warmup=50, autocast=False,
                        tokenizer_from="models/demo"),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), default="olmoe")
    ap.add_argument("--out", help="final checkpoint directory (olmoe: models/demo; deepseek_v3: target/demo-mtp)")
    ap.add_argument("--work", help="checkpoints, token cache, log while training (target/train-demo[-mtp])")
    ap.add_argument("--tokenizer-from", metavar="DIR",
                    help="reuse DIR/tokenizer.json instead of training one (deepseek_v3: models/demo)")
    ap.add_argument("--fortunes", default=FORTUNES_DIR)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-intermediate", type=int)
    ap.add_argument("--dense-intermediate", type=int, default=512, help="deepseek_v3: the dense first layer's MLP")
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, help="tie embeddings and lm_head")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01, help="olmoe: the load-balancing loss's weight")
    ap.add_argument("--mtp-lambda", type=float, default=0.3,
                    help="deepseek_v3: the MTP loss's weight (the DeepSeek-V3 report's lambda, 0.3 at first)")
    ap.add_argument("--bias-update-speed", type=float, default=1e-3,
                    help="deepseek_v3: the routers' bias step per optimizer step (the report's gamma)")
    ap.add_argument("--chat-fraction", type=float, default=0.35)
    ap.add_argument("--heldout-fraction", type=float, default=0.03)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--autocast", action=argparse.BooleanOptionalAction,
                    help="bf16 autocast for the matrix products (f32 master weights and optimizer; olmoe: on)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="dtype of the saved weights")
    ap.add_argument("--fresh", action="store_true", help="ignore checkpoints in --work and start over")
    ap.add_argument("--export-only", action="store_true", help="write --out from the best checkpoint in --work")
    ap.add_argument("--allow-other-versions", action="store_true")
    args = ap.parse_args(argv)
    for key, value in ARCH_DEFAULTS[args.arch].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def check_versions(allow: bool) -> dict[str, str]:
    import tokenizers
    import transformers

    got = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "tokenizers": tokenizers.__version__}
    bad = {k: v for k, v in got.items() if v != PINNED[k]}
    if bad and not allow:
        raise SystemExit(f"unpinned versions {bad} (want {PINNED}); pass --allow-other-versions to go on anyway")
    return got


def main(argv=None) -> None:
    args = parse_args(argv)
    versions = check_versions(args.allow_other_versions)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    work = Path(args.work)
    out = Path(args.out)
    if args.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path = work / "checkpoint.pt"
    resuming = ckpt_path.exists() and not args.export_only
    log_path = work / "train_log.txt"
    if args.export_only and log_path.exists():
        # The log is the training plus the latest export: drop an earlier export's lines.
        lines = log_path.read_text(encoding="utf-8").splitlines(keepends=True)
        cut = next((i for i, ln in enumerate(lines) if ln.startswith("# export:")), len(lines))
        log_path.write_text("".join(lines[:cut]), encoding="utf-8")
    log = Log(log_path, append=resuming or args.export_only)

    # --- text and split -----------------------------------------------------------------------------
    items = load_fortunes(Path(args.fortunes))
    rng = random.Random(args.seed)
    order = list(range(len(items)))
    rng.shuffle(order)
    n_held = max(1, int(len(items) * args.heldout_fraction))
    held = [items[i] for i in sorted(order[:n_held])]
    train = [items[i] for i in sorted(order[n_held:])]
    train_chars = sum(len(b) for _, b in train)
    held_chars = sum(len(b) for _, b in held)

    # --- tokenizer ----------------------------------------------------------------------------------
    tok_path = work / "tokenizer.json"
    if args.tokenizer_from and not tok_path.exists():
        shutil.copy(Path(args.tokenizer_from) / "tokenizer.json", tok_path)
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = train_tokenizer([b for _, b in train], args.vocab)
        tok.save(str(tok_path))
    special = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab_size = tok.get_vocab_size()

    held_ids = encode_docs(tok, [b + "\n" + EOT for _, b in held])
    held_data = windows(held_ids, args.seq)
    epoch0_ids = encode_docs(tok, epoch_documents(train, args.seed, 0, args.chat_fraction))

    cfg = model_config(args, vocab_size, special)
    model = build_model(cfg, args.seed)
    balancer = Balancer(model, args.bias_update_speed) if args.arch == "deepseek_v3" else None
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_params - n_expert + n_expert * args.top_k // args.experts

    if not resuming and not args.export_only:
        log("# Strata demo model training log (xtask/train_demo/train.py)")
        log(f"# argv: {' '.join(sys.argv[1:])}")
        log(f"# versions: {json.dumps(versions)}; threads {args.threads}; seed {args.seed}")
        log(f"# text: {len(items)} fortunes from {args.fortunes} ({len(train)} train, {train_chars} chars; "
            f"{len(held)} held out, {held_chars} chars)")
        log(f"# tokenizer: byte-level BPE, {vocab_size} entries; specials {special}"
            + (f"; from {args.tokenizer_from}" if args.tokenizer_from else ""))
        log(f"# tokens: {len(epoch0_ids)} per training epoch (chat fraction {args.chat_fraction}), "
            f"{len(held_ids)} held out ({held_data.shape[0]} windows of {args.seq})")
        mtp = " + 1 MTP layer" if args.arch == "deepseek_v3" else ""
        log(f"# model: {args.arch}, {args.layers} layers{mtp}, hidden {args.hidden}, {args.heads} heads, "
            f"{args.experts} experts x intermediate {args.expert_intermediate}, top-{args.top_k}, tied={args.tie}; "
            f"{n_params} parameters ({active} active per token)")
        side = (f"mtp lambda {args.mtp_lambda}, bias update {args.bias_update_speed}" if balancer
                else f"aux {args.aux_coef}")
        log(f"# schedule: {args.steps} steps x {args.batch} x {args.seq} tokens, AdamW lr {args.lr} "
            f"(warmup {args.warmup}, cosine to {args.min_lr_frac}x), wd {args.weight_decay}, {side}, "
            f"bf16 autocast {args.autocast}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    step, epoch, pos = 0, 0, 0
    best = {"loss": float("inf"), "step": -1}
    elapsed_before = 0.0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, epoch, pos = state["step"], state["epoch"], state["pos"]
        best = state["best"]
        elapsed_before = state["elapsed"]
        torch.set_rng_state(state["torch_rng"])
        if not args.export_only:
            log(f"# resumed at step {step} (epoch {epoch}, window {pos}); argv: {' '.join(sys.argv[1:])}; "
                f"schedule: {args.steps} steps")

    def epoch_windows(e: int) -> torch.Tensor:
        ids = epoch0_ids if e == 0 else encode_docs(tok, epoch_documents(train, args.seed, e, args.chat_fraction))
        w = windows(ids, args.seq)
        g = torch.Generator().manual_seed(args.seed * 7919 + e)
        return w[torch.randperm(w.shape[0], generator=g)]

    def save_checkpoint(elapsed: float) -> None:
        tmp = work / "checkpoint.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch, "pos": pos,
                    "best": best, "elapsed": elapsed, "torch_rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, ckpt_path)

    if not args.export_only and step < args.steps:
        model.train()
        cur = epoch_windows(epoch)
        t0 = time.time()
        run_loss, run_aux, run_imbalance, run_n = 0.0, 0.0, 0.0, 0
        side = "mtp" if balancer else "aux"
        while step < args.steps:
            if pos + args.batch > cur.shape[0]:
                epoch, pos = epoch + 1, 0
                cur = epoch_windows(epoch)
            x = cur[pos:pos + args.batch]
            pos += args.batch
            for g in opt.param_groups:
                g["lr"] = lr_at(step, args)
            lm_loss, aux, loss = losses(model, x, args)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if balancer:
                run_imbalance += balancer.step()
            step += 1
            run_loss += lm_loss.item()
            run_aux += aux.item()
            run_n += 1
            elapsed = elapsed_before + time.time() - t0
            if step % args.log_every == 0 or step == args.steps:
                balance = f"  busiest expert {run_imbalance / run_n:.2f}x the mean" if balancer else ""
                log(f"step {step:6d}  epoch {epoch:3d}  loss {run_loss / run_n:.4f}  {side} {run_aux / run_n:.3f}  "
                    f"lr {lr_at(step - 1, args):.2e}  {elapsed / 60:6.1f} min{balance}")
                run_loss, run_aux, run_imbalance, run_n = 0.0, 0.0, 0.0, 0
            if step % args.eval_every == 0 or step == args.steps:
                if balancer:
                    hl, ml, agreement = evaluate_mtp(model, held_data, 16, args.autocast)
                else:
                    hl = evaluate(model, held_data, 16, args.autocast)
                flag = ""
                if hl < best["loss"]:
                    best = {"loss": hl, "step": step}
                    torch.save(model.state_dict(), work / "best.pt")
                    flag = "  (best)"
                if balancer:
                    flag = f"  mtp loss {ml:.4f}  draft = argmax {100 * agreement:.1f}%{flag}"
                log(f"eval  {step:6d}  held-out loss {hl:.4f}  ppl {math.exp(hl):8.2f}{flag}")
            if step % args.ckpt_every == 0 or step == args.steps:
                save_checkpoint(elapsed)
        log(f"# trained {step} steps in {(elapsed_before + time.time() - t0) / 60:.1f} min; "
            f"best held-out loss {best['loss']:.4f} at step {best['step']}")

    export(args, work, out, tok, cfg, held, log, versions, n_params, active)


def export(args, work: Path, out: Path, tok: Tokenizer, cfg, held, log, versions, n_params: int, active: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

    best_path = work / "best.pt"
    if not best_path.exists():
        raise SystemExit(f"no {best_path}: train first")
    trained = build_model(cfg, args.seed)
    trained.load_state_dict(torch.load(best_path, weights_only=True))
    trained.eval()
    model = main_model(trained)

    stage = out.with_name(out.name + ".tmp-export")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True, exist_ok=True)

    model.config.output_router_logits = False
    # The routers' score-correction biases stay float32 (transformers keeps them so): rounded, they would choose
    # other experts than training did.
    biases = {n: b.detach().clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    model.to(getattr(torch, args.dtype))
    for name, bias in biases.items():
        owner, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(owner), attr, bias)
    model.save_pretrained(stage, safe_serialization=True)
    model.float()
    if isinstance(trained, torch.nn.ModuleDict):
        write_mtp_layer(trained, stage / "model.safetensors", getattr(torch, args.dtype))
    gen = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        do_sample=True, temperature=0.8, top_k=40, top_p=0.95, max_new_tokens=128)
    gen.save_pretrained(stage)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=END, unk_token=None, pad_token=EOT,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT], model_max_length=cfg.max_position_embeddings,
        clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(stage, save_jinja_files=False)
    # Keep exactly the standard files.
    for extra in ["special_tokens_map.json", "chat_template.jinja"]:
        (stage / extra).unlink(missing_ok=True)
    tc_path = stage / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = CHAT_TEMPLATE
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name transformers 4.x and 5.x both know
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")

    (stage / "heldout.txt").write_text("\n\n".join(b for _, b in held) + "\n", encoding="utf-8")

    # --- check the written checkpoint with transformers itself, and sample from it ------------------
    m2 = AutoModelForCausalLM.from_pretrained(stage, dtype=torch.float32)
    m2.eval()
    t2 = AutoTokenizer.from_pretrained(stage)
    msgs = [{"role": "user", "content": "Tell me a fortune."}]
    rendered = t2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == render(msgs) + ASSISTANT + "\n", rendered

    text = (stage / "heldout.txt").read_text(encoding="utf-8")
    ids = t2(text, add_special_tokens=False)["input_ids"]
    held_loss = evaluate(m2, windows(ids, cfg.max_position_embeddings), 16)

    samples = []
    eos = cfg.eos_token_id

    def gen_text(prompt_ids: list[int], sample: bool, seed: int) -> str:
        torch.manual_seed(seed)
        x = torch.tensor([prompt_ids])
        kw = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.95) if sample else dict(do_sample=False)
        y = m2.generate(x, max_new_tokens=60, eos_token_id=eos, pad_token_id=cfg.pad_token_id, **kw)
        return t2.decode(y[0, len(prompt_ids):], skip_special_tokens=False)

    for prompt in ["Once upon a time", "The best thing about"]:
        p = t2(prompt, add_special_tokens=False)["input_ids"]
        samples.append({"prompt": prompt, "mode": "greedy", "text": gen_text(p, False, 0)})
        for s in range(4):
            samples.append({"prompt": prompt, "mode": f"sampled (T=0.8, top-k 40, top-p 0.95, seed {s})",
                            "text": gen_text(p, True, s)})
    for q in ["Tell me a fortune.", "Tell me a joke.", "What do you think about love?", "Say something wise."]:
        chat = t2.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        p = t2(chat, add_special_tokens=False)["input_ids"]
        samples.append({"prompt": chat, "mode": "chat greedy", "text": gen_text(p, False, 0)})
        for s in range(1, 3):
            samples.append({"prompt": chat, "mode": f"chat sampled (seed {s})", "text": gen_text(p, True, s)})

    meta = {"held_out_loss_plain_text": held_loss, "held_out_tokens": len(ids), "parameters": n_params,
            "active_parameters_per_token": active, "versions": versions, "seed": args.seed,
            "threads": args.threads, "samples": samples}
    log(f"# export: {args.dtype} weights; held-out loss of heldout.txt as plain text: {held_loss:.4f} "
        f"(ppl {math.exp(held_loss):.2f}, {len(ids)} tokens)")
    if isinstance(trained, torch.nn.ModuleDict):
        meta["mtp"] = check_mtp(stage, m2, trained, held, t2, log)
    (work / "export.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    for s in samples:
        log(f"# sample [{s['mode']}] {s['prompt']!r} -> {s['text']!r}")

    shutil.copy(work / "train_log.txt", stage / "train_log.txt")
    # Publish: replace the generated files, keep anything else (the README) in place.
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(stage.iterdir()):
        f.chmod(0o644)  # save_pretrained writes the safetensors file 0600
        os.replace(f, out / f.name)
    stage.rmdir()
    files = sorted(out.iterdir())
    log(f"# wrote {out}: " + ", ".join(f"{f.name} ({f.stat().st_size} B)" for f in files))
    shutil.copy(work / "train_log.txt", out / "train_log.txt")


def write_mtp_layer(trained: torch.nn.ModuleDict, checkpoint: Path, dtype: torch.dtype) -> None:
    """Adds the MTP layer to the saved checkpoint as DeepSeek's hub checkpoints hold it (`model.layers.{N}.*`,
    N = num_hidden_layers; mtp_ref.hub_tensors), in `dtype` but for the router's float32 bias."""
    from safetensors.torch import load_file, save_file

    from mtp_ref import hub_tensors

    tensors = load_file(checkpoint)
    for name, t in hub_tensors(trained["model"], trained["mtp"]).items():
        tensors[name] = t if name.endswith("e_score_correction_bias") else t.to(dtype)
    save_file(tensors, checkpoint, metadata={"format": "pt"})


@torch.no_grad()
def check_mtp(checkpoint: Path, m2, trained: torch.nn.ModuleDict, held, t2, log) -> dict:
    """Reads the written MTP layer back as the fixtures' reference does (mtp_ref.load_mtp over the checkpoint's own
    DeepseekV3ForCausalLM) and measures what a greedy verify pass would accept of its first draft: on each of 32
    held-out fortunes' first words, 48 greedy tokens of the main model, and the layer's draft of every one of them
    but the first from the hidden state and token before (mtp_ref.draft_logits, teacher-forced on the greedy text).
    Also checks that the written layer drafts as the trained one did (float32 and the saved dtype apart)."""
    from mtp_ref import draft_logits, load_mtp

    mtp2 = load_mtp(checkpoint, m2)
    prompts, accepted, drafted, same, rows = [], 0, 0, 0, 0
    for _, body in held[:: max(1, len(held) // 32)][:32]:
        prompt = " ".join(body.split()[:4])
        p = t2(prompt, add_special_tokens=False)["input_ids"]
        ids = m2.generate(torch.tensor([p]), max_new_tokens=48, do_sample=False, pad_token_id=m2.config.pad_token_id,
                          eos_token_id=None)[0].tolist()
        logits = draft_logits(m2, mtp2, ids)
        # Row i drafts token i + 2: the generated tokens after the first (the last row drafts past the text).
        hits = logits.argmax(-1)[len(p) - 1:-1] == torch.tensor(ids[len(p) + 1:]).numpy()
        accepted += int(hits.sum())
        drafted += len(hits)
        _, trained_drafts = pair_logits(trained, torch.tensor([ids]))
        same += int((trained_drafts[0].argmax(-1).numpy() == logits.argmax(-1)).sum())
        rows += len(logits)
        prompts.append(prompt)
    figures = {"greedy_first_draft_accepted": accepted, "greedy_first_drafts": drafted,
               "greedy_first_draft_acceptance": accepted / drafted, "prompts": prompts,
               "written_layer_top1_agrees_with_trained": same / rows}
    log(f"# export: MTP layer read back (mtp_ref.load_mtp): its first draft is the main model's greedy token "
        f"{accepted}/{drafted} = {100 * accepted / drafted:.1f}% of the time on {len(prompts)} held-out prompts "
        f"(48 greedy tokens each); its drafts' top-1 agrees with the trained layer's on {100 * same / rows:.1f}%")
    return figures


if __name__ == "__main__":
    main()
