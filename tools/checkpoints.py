"""checkpoints.py - the Python mirror of engine/kipp_checkpoints.h.

The C header compiles in the registry of pinned Qwen3 dense checkpoints; this
module mirrors it entry by entry for the tooling (make_checkpoint,
convert_to_gguf, download_model). The field names are exactly those printed by
`build/kipp registry --json`; tests/test_tooling.py compares the two copies
field by field and checks every entry against the family invariants and against
data/qwen3/qwen3-configs/*.config.json.

Beyond the C table, each entry carries the download facts of
data/qwen3/qwen3-registry.md: how the weights are split on the Hub and the
recorded sha256/size of the files we know. Those come from public pins that
could not be checked against the Hub from here ("pinned, unverified"); no
hash here is invented. Where a fact is unknown the field is None, and the
downloader falls back to the sha256 the pinned revision's tree reports.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Optional

# Family invariants (kipp_checkpoints.h).
VOCAB_SIZE = 151936          # logits rows; ids >= N_TOKENS are padding
N_KV_HEAD = 8
HEAD_DIM = 128
RMS_EPS = 1e-6
BOS_ID = 151643              # <|endoftext|>
N_TOKENS = 151669            # 151643 BPE tokens + 26 added tokens
FIRST_ADDED_ID = 151643      # added tokens are ids 151643..151668
ARCHITECTURE = "Qwen3ForCausalLM"

SYNTH_GENERATOR = "kipp-synth-v1"          # bump when make_checkpoint output changes
SYNTH_REV_PREFIX = SYNTH_GENERATOR + "-seed"

STOP_BASE = (151643,)
STOP_CHAT = (151645, 151643)

# Revision status of an entry (a Python-only field; the C table has no such column).
PINNED_UNVERIFIED = "pinned-unverified"  # public pin, not yet checked against the Hub
SYNTHETIC = "synthetic"                  # written by tools/make_checkpoint.py
UNPINNED = "unpinned"                    # no known revision: the downloader refuses it

# Tokenizer files (data/qwen3/qwen3-tokenizer/NOTICE, qwen3-registry.md "Files on the Hub").
TOKENIZER_JSON_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
TOKENIZER_JSON_SIZE = 11422654
# chat kind -> (file name in data/qwen3/qwen3-tokenizer/, Hub sha256 of tokenizer_config.json, size or None)
TOKENIZER_CONFIGS: dict[str, tuple[str, str, Optional[int]]] = {
    "hybrid": ("tokenizer_config.json",
               "d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101", 9732),
    "none": ("tokenizer_config.base.json",
             "3c04ed3ca964ea2f6b2b5faf0dc4d31aec1cb1e8b4bcf63f402d295046b422b5", None),
    "instruct-2507": ("tokenizer_config.instruct-2507.json",
                      "a62ff0a2472a0fa1b8eaabcb57c59b58afa42a22831dc141400b6e0cf2b65ce3", None),
    "thinking-2507": ("tokenizer_config.thinking-2507.json",
                      "60adcfc35f5f251e19a196ec977b4ca0fcfb534852911b3196d68d5e3b146aa0", None),
}

# config.json of the 10 checkpoints with a file in data/qwen3/qwen3-configs/: (sha256, bytes).
# Its NOTICE says each file was matched to the hash the public pins give for the Hub
# file; tests/test_tooling.py re-hashes the vendored copies against this table.
CONFIG_JSON_FACTS: dict[str, tuple[str, int]] = {
    "qwen3-0.6b-base": ("504a6b58c4271583724e66584b6b7698aea18450209df6b2f7582df0e89cee59", 727),
    "qwen3-0.6b": ("660db3b73d788119c04535e48cf9be5f55bc3100841a718637ae695b442f27dd", 726),
    "qwen3-1.7b-base": ("1bb33a92c3548fbc68b889b490e810440435253598835bd71dff0396060c12db", 727),
    "qwen3-1.7b": ("1ddb5b89ebc90dcb417a45c213d818577e65976454d29385c8f6140771d95197", 726),
    "qwen3-4b-base": ("304b2545a258d35620f1d4bf46940c0471d9baa00715ff8e77f84c2fca5057c1", 727),
    "qwen3-4b": ("8ba006f74fecfaaeb392872a60f4a480e7ec9860153d2e1b769ec81f9a147f8a", 726),
    "qwen3-8b-base": ("3bd01d7ad7a2e203ecbbe84e24087a51c6d2a108ee4bcc42d0016bf49564983a", 729),
    "qwen3-8b": ("f7c4eadfbbf522470667b797a3c89be2524832d2d599797248dc304fff447c30", 728),
    "qwen3-14b": ("e73c3664ca09b10a673fef0c22e8a6b456201d49bd4713c9691f775720e8857a", 728),
    "qwen3-32b": ("97e295b63283935788fac5e4f8860862a56d4089538cafc93f0431f2ebe483bb", 728),
}


@dataclass(frozen=True)
class FileFact:
    """Recorded facts about one file of a pinned revision (None = not recorded)."""
    sha256: Optional[str] = None  # lowercase hex of the file's bytes
    size: Optional[int] = None    # bytes


@dataclass(frozen=True)
class Checkpoint:
    """One registry entry; fields up to stop_token_ids mirror kipp_checkpoint in C.

    Dimensions are counts, context_length is in tokens, rope_theta is the RoPE
    base. `revision_status` and the download facts after it are Python-only.
    """
    id: str
    repository: str
    revision: Optional[str]     # 40-hex commit, "kipp-synth-v1-seedN", or None when unknown
    synthetic: bool
    variant: str                # base | instruct | thinking | embedding | reranker
    chat_template: str          # none | hybrid | instruct-2507 | thinking-2507
    d_model: int
    n_layer: int
    n_q_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope_theta: float
    tied_embeddings: bool
    eos_token_id: int
    stop_token_ids: tuple[int, ...]
    revision_status: str = PINNED_UNVERIFIED
    weight_shards: Optional[int] = None   # 1 = single model.safetensors; None = unknown
    files: dict[str, FileFact] = field(default_factory=dict)  # recorded file facts
    weights: str = "gaussian"   # synthetic only: "gaussian", or "outliers" (loud rows and heavy
                                # tails in the projections, tools/make_checkpoint.py)
    # YaRN the model card allows (kipp_checkpoint's yarn_factor / yarn_original_context): factor and
    # original_max_position_embeddings; 0 / 0 = the card gives none. kipp plan and --rope-scaling yarn:F
    # (no ORIG) read them; the scaled limit is yarn_original_context x yarn_factor.
    yarn_factor: float = 0.0
    yarn_original_context: int = 0

    @property
    def yarn_context(self) -> int:
        """The card's YaRN context, tokens (0 without one): original_max_position_embeddings x factor."""
        return int(self.yarn_original_context * self.yarn_factor)

    hub_vocab_rows: Optional[int] = None  # retrieval checkpoints: embedding rows of the Hub file (padded
                                          # to vocab_size by the converter); None = vocab_size
    hub_tied: Optional[bool] = None       # config.json's tie_word_embeddings where it differs from the Kipp
                                          # file's (tied_embeddings): Qwen3-Embedding-8B, untied on the Hub
                                          # with no lm_head, is written tied (docs/FORMAT.md); None = same

    @property
    def hub_rows(self) -> int:
        """Embedding (and lm_head) rows of the Hugging Face file: hub_vocab_rows, else vocab_size."""
        return self.hub_vocab_rows if self.hub_vocab_rows is not None else self.vocab_size

    @property
    def hub_tie(self) -> bool:
        """config.json's tie_word_embeddings of the Hugging Face file."""
        return self.tied_embeddings if self.hub_tied is None else self.hub_tied

    @property
    def hub_prefix(self) -> str:
        """Prefix of the decoder's tensor names in the Hub file: "" for Qwen3-Embedding (a Qwen3Model
        saved by sentence-transformers: embed_tokens.weight, layers.N..., norm.weight, no lm_head),
        "model." for the Qwen3ForCausalLM files (generation and Qwen3-Reranker)."""
        return "" if self.variant == "embedding" else "model."

    @property
    def hub_lm_head(self) -> bool:
        """True when the Hub file must hold its own lm_head.weight (an untied Qwen3ForCausalLM)."""
        return self.variant != "embedding" and not self.hub_tie

    @property
    def task(self) -> str:
        """"generate", "embed" or "rerank" (kipp_model_task in C), from the variant."""
        return {"embedding": "embed", "reranker": "rerank"}.get(self.variant, "generate")

    @property
    def attn_width(self) -> int:
        """Attention width n_q_head*128 (not d_model: they differ at 0.6B and 32B)."""
        return self.n_q_head * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Logical KV bytes per token: n_layer * 2 (K,V) * 8 * 128 * 2 (BF16)."""
        return self.n_layer * 2 * self.n_kv_head * self.head_dim * 2

    @property
    def seed(self) -> int:
        """Generator seed of a synthetic entry (the N of "kipp-synth-v1-seedN")."""
        if not self.synthetic or not self.revision or not self.revision.startswith(SYNTH_REV_PREFIX):
            raise ValueError(f"checkpoint {self.id} is not a synthetic entry with revision "
                             f"'{SYNTH_REV_PREFIX}<N>' (found {self.revision!r})")
        return int(self.revision[len(SYNTH_REV_PREFIX):])

    @property
    def is_pinned(self) -> bool:
        """True when the revision is a 40-hex commit the downloader may fetch."""
        return (self.revision_status == PINNED_UNVERIFIED and self.revision is not None
                and re.fullmatch(r"[0-9a-f]{40}", self.revision) is not None)

    def weight_files(self) -> Optional[list[str]]:
        """Hub weight file names when the shard count is recorded, else None."""
        if self.weight_shards is None:
            return None
        if self.weight_shards == 1:
            return ["model.safetensors"]
        n = self.weight_shards
        return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)] + \
            ["model.safetensors.index.json"]

    def registry_json(self) -> dict:
        """The dict `kipp registry --json` prints for this entry (same keys, same order)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("revision_status", "weight_shards", "files", "weights", "yarn_factor",
                               "yarn_original_context", "hub_vocab_rows", "hub_tied")}
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["revision_status"] = self.revision_status
        d["yarn_factor"] = self.yarn_factor
        d["yarn_original_context"] = self.yarn_original_context
        d["yarn_context"] = self.yarn_context
        return d


def _real(id_: str, repo: str, rev: str, variant: str, chat: str, d: int, L: int, nq: int,
          ff: int, ctx: int, theta: float, tied: bool, shards: Optional[int],
          model_size: Optional[int] = None) -> Checkpoint:
    """Build a real (Hub) entry with the recorded file facts of registry.md."""
    eos = 151643 if variant == "base" else 151645
    files: dict[str, FileFact] = {}
    _, cfg_sha, cfg_size = TOKENIZER_CONFIGS[chat]
    files["tokenizer_config.json"] = FileFact(cfg_sha, cfg_size)
    if chat == "hybrid":  # registry.md records tokenizer.json for the hybrid checkpoints
        files["tokenizer.json"] = FileFact(TOKENIZER_JSON_SHA256, TOKENIZER_JSON_SIZE)
    if id_ in CONFIG_JSON_FACTS:
        files["config.json"] = FileFact(*CONFIG_JSON_FACTS[id_])
    if model_size is not None:
        files["model.safetensors"] = FileFact(None, model_size)
    return Checkpoint(id_, repo, rev, False, variant, chat, d, L, nq, N_KV_HEAD, HEAD_DIM, ff,
                      VOCAB_SIZE, ctx, theta, tied, eos, STOP_BASE if variant == "base" else STOP_CHAT,
                      PINNED_UNVERIFIED, shards, files)


# Retrieval checkpoints (issue 56). Sources, all third-party copies (unverified against the Hub):
# the revisions are Hugging Face cache snapshot paths of public code; the configs follow the Qwen3
# model of the same size (Qwen3-Embedding-0.6B's config.json, as copied in public code: eos 151643,
# max_position_embeddings 32768, tied, vocab_size 151669; Qwen3-Embedding-8B: vocab 151665, 40960).
RETRIEVAL_HUB_VOCAB = {"qwen3-embedding-8b": 151665}


def _retrieval(id_: str, repo: str, rev: str, variant: str, d: int, L: int, nq: int, ff: int, ctx: int,
               tied: bool) -> Checkpoint:
    """A Qwen3-Embedding / Qwen3-Reranker entry: no chat template (the prompts are fixed by the
    model cards); eos <|endoftext|> for both roles (the token an embedding pools; a reranker
    never generates, so its stops are unused). `tied` is the Hub config's tie_word_embeddings;
    an embedding file never carries a head (the Hub file has no lm_head and the head is never
    run), so its Kipp file is always tied: token_embd only."""
    file_tied = tied or variant == "embedding"
    return Checkpoint(id_, repo, rev, False, variant, "none", d, L, nq, N_KV_HEAD, HEAD_DIM, ff, VOCAB_SIZE,
                      ctx, 1e6, file_tied, BOS_ID, STOP_BASE,
                      PINNED_UNVERIFIED, None, {}, hub_vocab_rows=RETRIEVAL_HUB_VOCAB.get(id_, N_TOKENS),
                      hub_tied=None if file_tied == tied else tied)


def _synth(id_: str, repo: str, seed: int, variant: str, chat: str, d: int, L: int, nq: int,
           ff: int, ctx: int, tied: bool, weights: str = "gaussian") -> Checkpoint:
    """Build a synthetic entry (tools/make_checkpoint.py writes it; never downloaded). A retrieval
    twin has its real counterpart's Hub vocabulary rows (151669) and layout (hub_prefix)."""
    eos = 151643 if chat == "none" else 151645
    retrieval = variant in ("embedding", "reranker")
    return Checkpoint(id_, repo, f"{SYNTH_REV_PREFIX}{seed}", True, variant, chat, d, L, nq,
                      N_KV_HEAD, HEAD_DIM, ff, VOCAB_SIZE, ctx, 1e6, tied, eos,
                      STOP_BASE if eos == 151643 else STOP_CHAT, SYNTHETIC, None, {}, weights,
                      hub_vocab_rows=N_TOKENS if retrieval else None)


# Same order as KIPP_CHECKPOINT_TABLE. Sources: data/qwen3/qwen3-registry.md.
CHECKPOINTS: tuple[Checkpoint, ...] = (
    _real("qwen3-0.6b-base", "Qwen/Qwen3-0.6B-Base", "da87bfb608c14b7cf20ba1ce41287e8de496c0cd",
          "base", "none", 1024, 28, 16, 3072, 32768, 1e6, True, 1, 1192135096),
    _real("qwen3-0.6b", "Qwen/Qwen3-0.6B", "c1899de289a04d12100db370d81485cdf75e47ca",
          "instruct", "hybrid", 1024, 28, 16, 3072, 40960, 1e6, True, 1, 1503300328),
    _real("qwen3-1.7b-base", "Qwen/Qwen3-1.7B-Base", "ea980cb0a6c2ae4b936e82123acc929f1cec04c1",
          "base", "none", 2048, 28, 16, 6144, 32768, 1e6, True, None),
    _real("qwen3-1.7b", "Qwen/Qwen3-1.7B", "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e",
          "instruct", "hybrid", 2048, 28, 16, 6144, 40960, 1e6, True, 2),
    _real("qwen3-4b-base", "Qwen/Qwen3-4B-Base", "906bfd4b4dc7f14ee4320094d8b41684abff8539",
          "base", "none", 2560, 36, 32, 9728, 32768, 1e6, True, 3),
    _real("qwen3-4b", "Qwen/Qwen3-4B", "1cfa9a7208912126459214e8b04321603b3df60c",
          "instruct", "hybrid", 2560, 36, 32, 9728, 40960, 1e6, True, 3),
    _real("qwen3-4b-instruct-2507", "Qwen/Qwen3-4B-Instruct-2507",
          "cdbee75f17c01a7cc42f958dc650907174af0554",
          "instruct", "instruct-2507", 2560, 36, 32, 9728, 262144, 5e6, True, 3),
    _real("qwen3-4b-thinking-2507", "Qwen/Qwen3-4B-Thinking-2507",
          "768f209d9ea81521153ed38c47d515654e938aea",
          "thinking", "thinking-2507", 2560, 36, 32, 9728, 262144, 5e6, True, None),
    _real("qwen3-8b-base", "Qwen/Qwen3-8B-Base", "49e3418fbbbca6ecbdf9608b4d22e5a407081db4",
          "base", "none", 4096, 36, 32, 12288, 32768, 1e6, False, 5),
    _real("qwen3-8b", "Qwen/Qwen3-8B", "b968826d9c46dd6066d109eabc6255188de91218",
          "instruct", "hybrid", 4096, 36, 32, 12288, 40960, 1e6, False, 5),
    _real("qwen3-14b-base", "Qwen/Qwen3-14B-Base", "0b0bd3732e2c374d483664439ea334928b65f304",
          "base", "none", 5120, 40, 40, 17408, 32768, 1e6, False, 8),
    _real("qwen3-14b", "Qwen/Qwen3-14B", "40c069824f4251a91eefaf281ebe4c544efd3e18",
          "instruct", "hybrid", 5120, 40, 40, 17408, 40960, 1e6, False, 8),
    _real("qwen3-32b", "Qwen/Qwen3-32B", "9216db5781bf21249d130ec9da846c4624c16137",
          "instruct", "hybrid", 5120, 64, 64, 25600, 40960, 1e6, False, 17),
    _retrieval("qwen3-embedding-0.6b", "Qwen/Qwen3-Embedding-0.6B", "97b0c614be4d77ee51c0cef4e5f07c00f9eb65b3",
               "embedding", 1024, 28, 16, 3072, 32768, True),
    _retrieval("qwen3-embedding-4b", "Qwen/Qwen3-Embedding-4B", "5cf2132abc99cad020ac570b19d031efec650f2b",
               "embedding", 2560, 36, 32, 9728, 40960, True),
    _retrieval("qwen3-embedding-8b", "Qwen/Qwen3-Embedding-8B", "1d8ad4ca9b3dd8059ad90a75d4983776a23d44af",
               "embedding", 4096, 36, 32, 12288, 40960, False),
    _retrieval("qwen3-reranker-0.6b", "Qwen/Qwen3-Reranker-0.6B", "e61197ed45024b0ed8a2d74b80b4d909f1255473",
               "reranker", 1024, 28, 16, 3072, 40960, True),
    _retrieval("qwen3-reranker-4b", "Qwen/Qwen3-Reranker-4B", "22e683669bc0f0bd69640a1354a6d0aebcfeede5",
               "reranker", 2560, 36, 32, 9728, 40960, True),
    _retrieval("qwen3-reranker-8b", "Qwen/Qwen3-Reranker-8B", "77d193c791ed757ca307ee72715aa132723da912",
               "reranker", 4096, 36, 32, 12288, 40960, False),
    # Synthetic: tiny test shapes (attention width != d_model) and real benchmark shapes.
    _synth("synthetic-tiny", "synthetic/qwen3-tiny", 1, "instruct", "hybrid", 256, 2, 16, 512, 4096, True),
    _synth("synthetic-tiny-untied", "synthetic/qwen3-tiny-untied", 2, "base", "none", 384, 3, 8, 640, 4096, False),
    # Loud rows and heavy-tailed projections (the int8-activation fidelity gate of tests/test_quant_forward.c).
    _synth("synthetic-tiny-outliers", "synthetic/qwen3-tiny-outliers", 7, "instruct", "hybrid", 256, 4, 16, 768,
           4096, True, "outliers"),
    _synth("synthetic-0.6b", "synthetic/qwen3-0.6b-shape", 3, "instruct", "hybrid", 1024, 28, 16, 3072, 40960, True),
    _synth("synthetic-1.7b", "synthetic/qwen3-1.7b-shape", 4, "instruct", "hybrid", 2048, 28, 16, 6144, 40960, True),
    _synth("synthetic-4b", "synthetic/qwen3-4b-shape", 5, "instruct", "hybrid", 2560, 36, 32, 9728, 40960, True),
    _synth("synthetic-8b", "synthetic/qwen3-8b-shape", 6, "instruct", "hybrid", 4096, 36, 32, 12288, 40960, False),
    # Synthetic retrieval twins: synthetic-tiny's shape (make models-test), and the 0.6B shape (make bench-embed).
    _synth("synthetic-tiny-embedding", "synthetic/qwen3-tiny-embedding", 8, "embedding", "none", 256, 2, 16, 512,
           4096, True),
    _synth("synthetic-tiny-reranker", "synthetic/qwen3-tiny-reranker", 9, "reranker", "none", 256, 2, 16, 512,
           4096, True),
    _synth("synthetic-0.6b-embedding", "synthetic/qwen3-0.6b-embedding", 10, "embedding", "none", 1024, 28, 16, 3072,
           32768, True),
)

# Model cards that give YaRN: Qwen3-4B/8B/14B/32B, "32,768 natively and 131,072 tokens with YaRN"
# (rope_scaling {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768}); the 0.6B and
# 1.7B cards give 32,768 only, the Base cards no YaRN, the 2507 cards 262,144 natively. The synthetic
# 4B and 8B shapes mirror their hybrid entries.
YARN_CARD = (4.0, 32768)
_YARN_IDS = ("qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "synthetic-4b", "synthetic-8b")
CHECKPOINTS = tuple(dataclasses.replace(c, yarn_factor=YARN_CARD[0], yarn_original_context=YARN_CARD[1])
                    if c.id in _YARN_IDS else c for c in CHECKPOINTS)

_BY_ID = {c.id: c for c in CHECKPOINTS}


def by_id(id_: str) -> Checkpoint:
    """Return the entry with this short id; raises KeyError naming the known ids."""
    try:
        return _BY_ID[id_]
    except KeyError:
        raise KeyError(f"unknown checkpoint id '{id_}' (expected one of: {', '.join(_BY_ID)})") from None


def find(repository: str, revision: str) -> Optional[Checkpoint]:
    """The entry whose (repository, revision) match exactly, else None (kipp_checkpoint_find)."""
    for c in CHECKPOINTS:
        if c.repository == repository and c.revision == revision:
            return c
    return None


def tokenizer_config_source(c: Checkpoint) -> str:
    """File name under data/qwen3/qwen3-tokenizer/ of the entry's tokenizer_config.json."""
    return TOKENIZER_CONFIGS[c.chat_template][0]


def _json_number(x: float) -> float | int:
    """rope_theta as transformers writes it: an int when integral (1000000, not 1e6)."""
    return int(x) if float(x).is_integer() else x


def hf_config(c: Checkpoint) -> dict:
    """config.json of this entry exactly as transformers 4.51 writes it for Qwen3ForCausalLM.

    The key set and constant values are those of data/qwen3/qwen3-configs/*.config.json;
    tests/test_tooling.py checks that this reproduces each real file byte for byte. Retrieval
    entries keep the key set (their Hub configs, as third-party copies show them, are the same
    Qwen3ForCausalLM config) with the Hub file's vocab_size (hub_rows) and tie_word_embeddings.
    """
    return {
        "architectures": [ARCHITECTURE],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": c.eos_token_id,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.d_model,
        "initializer_range": 0.02,
        "intermediate_size": c.d_ff,
        "max_position_embeddings": c.context_length,
        "max_window_layers": c.n_layer,
        "model_type": "qwen3",
        "num_attention_heads": c.n_q_head,
        "num_hidden_layers": c.n_layer,
        "num_key_value_heads": c.n_kv_head,
        "rms_norm_eps": RMS_EPS,
        "rope_scaling": None,
        "rope_theta": _json_number(c.rope_theta),
        "sliding_window": None,
        "tie_word_embeddings": c.hub_tie,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c.hub_rows,
    }


def hf_config_text(c: Checkpoint) -> str:
    """config.json bytes: transformers' indent-2 sorted JSON. The Hub's Base configs end
    with a newline and the others do not (data/qwen3/qwen3-configs); we follow the same rule."""
    return json.dumps(hf_config(c), indent=2, sort_keys=True) + ("\n" if c.variant == "base" else "")


def hf_generation_config(c: Checkpoint) -> dict:
    """generation_config.json per qwen3-registry.md ("generation_config.json")."""
    if c.eos_token_id == BOS_ID:  # base and retrieval: <|endoftext|> ends the text
        return {"bos_token_id": BOS_ID, "do_sample": False, "eos_token_id": BOS_ID,
                "max_new_tokens": 2048, "transformers_version": "4.51.0"}
    temp, top_p = (0.7, 0.8) if c.chat_template == "instruct-2507" else (0.6, 0.95)
    return {"bos_token_id": BOS_ID, "do_sample": True, "eos_token_id": list(c.stop_token_ids),
            "pad_token_id": BOS_ID, "temperature": temp, "top_k": 20, "top_p": top_p,
            "transformers_version": "4.51.0"}
