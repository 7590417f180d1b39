"""Generate conformance.json.gz: Hugging Face tokenizers' own output for many
tokenizer.json variants, to check stages/tokenizer against.

Run where `tokenizers` (0.23.2 here) is installed, from the repository root:

    python3 stages/tokenizer/testdata/gen_conformance.py OUTDIR

Each variant is one of the conformance tokenizers in testdata/tokenizers with
a patch: top-level components replaced ("normalizer", "pre_tokenizer",
"decoder", "added_tokens"), model fields set ("model"), vocabulary entries
added ("vocab_add"). For every variant the file records, for every text,
encode(text, add_special_tokens=False).ids and decode(ids,
skip_special_tokens=False) (null when equal to the text), decode of random id
lists, get_vocab_size(with_added_tokens=True), and token_to_id of a few
strings; or the load error if tokenizers refuses the variant.
"""

import copy
import gzip
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

BASES = {
    "bytelevel": "testdata/tokenizers/bytelevel/tokenizer.json",
    "llama3split": "testdata/tokenizers/llama3split/tokenizer.json",
    "lfm2tiny": "testdata/lfm2-audio-tiny/tokenizer.json",
}

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tiktoken's cl100k spelling, with possessive quantifiers.
CL100K_POSSESSIVE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"
                     r" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def bl(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def split(pattern, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern},
            "behavior": behavior, "invert": invert}


def seq(*pts):
    return {"type": "Sequence", "pretokenizers": list(pts)}


def nseq(*ns):
    return {"type": "Sequence", "normalizers": list(ns)}


def dseq(*ds):
    return {"type": "Sequence", "decoders": list(ds)}


def with_split(s):
    """A Split followed by byte-level spelling, the modern layout."""
    return {"pre_tokenizer": seq(s, bl(use_regex=False))}


def added(base, changes=(), extra=()):
    """The base's added_tokens with some entries changed and some added."""
    toks = copy.deepcopy(base["added_tokens"])
    for content, fields in changes:
        for t in toks:
            if t["content"] == content:
                t.update(fields)
    for t in extra:
        toks.append(dict({"single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": False}, **t))
    return toks


BYTES = {"<0x%02X>" % b: 900 + b for b in range(256)}


def variants(bases):
    b = bases["bytelevel"]
    v = [
        ("bytelevel", "bytelevel", {}),
        ("llama3split", "llama3split", {}),
        ("lfm2tiny", "lfm2tiny", {}),
        ("prefix_space", "bytelevel", {"pre_tokenizer": bl(add_prefix_space=True)}),
        ("no_regex", "bytelevel", {"pre_tokenizer": bl(use_regex=False)}),
        ("nfc", "bytelevel", {"normalizer": {"type": "NFC"}}),
        ("nfd", "bytelevel", {"normalizer": {"type": "NFD"}}),
        ("nfkc", "bytelevel", {"normalizer": {"type": "NFKC"}}),
        ("nfkd", "bytelevel", {"normalizer": {"type": "NFKD"}}),
        ("lowercase", "bytelevel", {"normalizer": {"type": "Lowercase"}}),
        ("bert_like_norm", "bytelevel", {"normalizer": nseq({"type": "NFD"}, {"type": "StripAccents"},
                                                            {"type": "Lowercase"})}),
        ("strip_norm", "bytelevel", {"normalizer": {"type": "Strip", "strip_left": True, "strip_right": True}}),
        ("lstrip_norm", "bytelevel", {"normalizer": {"type": "Strip", "strip_left": True, "strip_right": False}}),
        ("nmt", "bytelevel", {"normalizer": {"type": "Nmt"}}),
        ("prepend", "bytelevel", {"normalizer": {"type": "Prepend", "prepend": "\u2581"}}),
        ("replace_str", "bytelevel", {"normalizer": {"type": "Replace", "pattern": {"String": " "},
                                                     "content": "\u2581"}}),
        ("replace_re", "bytelevel", {"normalizer": nseq({"type": "Replace", "pattern": {"Regex": r"\s+"},
                                                         "content": " "}, {"type": "NFKC"})}),
        ("bytelevel_norm", "bytelevel", {"normalizer": {"type": "ByteLevel"}, "pre_tokenizer": None}),
        ("split_ws_removed", "bytelevel", with_split(split(r"\s+", "Removed"))),
        ("split_ws_prev", "bytelevel", with_split(split(r"\s+", "MergedWithPrevious"))),
        ("split_ws_next", "bytelevel", with_split(split(r"\s+", "MergedWithNext"))),
        ("split_ws_contig", "bytelevel", with_split(split(r"\s", "Contiguous"))),
        ("split_word_invert", "bytelevel", with_split(split(r"\p{L}+", "Removed", invert=True))),
        ("split_word_invert_next", "bytelevel", with_split(split(r"\p{L}+", "MergedWithNext", invert=True))),
        ("split_literal", "bytelevel", with_split(split(" ", "MergedWithPrevious", literal=True))),
        ("split_literal_meta", "bytelevel", with_split(split(".*", "Isolated", literal=True))),
        ("split_empty_star", "bytelevel", with_split(split(r"x*", "MergedWithNext"))),
        ("split_empty_star_prev", "bytelevel", with_split(split(r"a*", "MergedWithPrevious"))),
        ("split_empty_star_contig", "bytelevel", with_split(split(r"\d*", "Contiguous"))),
        ("split_anchors", "bytelevel", with_split(split(r"^\w|\w$", "Isolated"))),
        ("split_dot", "bytelevel", with_split(split(r".{1,4}", "Isolated"))),
        ("split_dotall", "bytelevel", with_split(split(r"(?m:.{1,4})", "Isolated"))),
        ("split_ignorecase", "bytelevel", with_split(split(r"(?i:'s|'t|k)", "Isolated"))),
        ("split_hex_brace", "bytelevel", with_split(split(r"[\x{4E00}-\x{9FFF}]+|\x{1F600}", "Isolated"))),
        ("split_possessive", "bytelevel", with_split(split(CL100K_POSSESSIVE, "Isolated"))),
        ("split_o200k", "bytelevel", with_split(split(O200K, "Isolated"))),
        ("split_lookbehind", "bytelevel", with_split(split(r"(?<=\d)(?=(\d{3})+(?!\d))", "Isolated"))),
        ("split_hexdigit", "bytelevel", with_split(split(r"\h+", "Isolated"))),
        ("split_word_class", "bytelevel", with_split(split(r"[\w'-]+|\W", "Isolated"))),
        ("split_word_boundary", "bytelevel", with_split(split(r"\b", "Isolated"))),
        ("split_word_boundary_next", "bytelevel", with_split(split(r"\b", "MergedWithNext"))),
        ("split_nonboundary", "bytelevel", with_split(split(r"\B.", "Removed"))),
        ("split_fixed_lazy", "bytelevel", with_split(split(r"\d{2}?|[a-z]{,2}|[A-Z]{2,}?", "Isolated"))),
        ("split_interval_plus", "bytelevel", with_split(split(r"\p{L}{2}+|\p{N}{1,2}+", "Isolated"))),
        ("split_not_letter", "bytelevel", with_split(split(r"\p{^L}+", "MergedWithPrevious"))),
        ("split_atomic", "bytelevel", with_split(split(r"(?>\s+)(?!\S)|\s+|\S+", "Isolated"))),
        ("split_only_no_bytelevel", "bytelevel", {"pre_tokenizer": split(LLAMA3, "Isolated")}),
        ("digits", "bytelevel", {"pre_tokenizer": seq({"type": "Digits", "individual_digits": False}, bl())}),
        ("digits_individual", "bytelevel", {"pre_tokenizer": seq({"type": "Digits", "individual_digits": True},
                                                                bl())}),
        ("punct", "bytelevel", {"pre_tokenizer": seq({"type": "Punctuation", "behavior": "Isolated"},
                                                    bl(use_regex=False))}),
        ("punct_prev", "bytelevel", {"pre_tokenizer": seq({"type": "Punctuation", "behavior": "MergedWithPrevious"},
                                                         bl(use_regex=False))}),
        ("punct_next_removed", "bytelevel", {"pre_tokenizer": seq(
            {"type": "Punctuation", "behavior": "MergedWithNext"},
            split(r"[.,]", "Removed"), bl(use_regex=False))}),
        ("punct_contig", "bytelevel", {"pre_tokenizer": seq({"type": "Punctuation", "behavior": "Contiguous"},
                                                           bl(use_regex=False))}),
        ("whitespace", "bytelevel", {"pre_tokenizer": seq({"type": "Whitespace"}, bl(use_regex=False))}),
        ("whitespace_split", "bytelevel", {"pre_tokenizer": seq({"type": "WhitespaceSplit"},
                                                               bl(use_regex=False))}),
        ("bert_pretok", "bytelevel", {"pre_tokenizer": seq({"type": "BertPreTokenizer"}, bl(use_regex=False))}),
        ("delimiter", "bytelevel", {"pre_tokenizer": seq({"type": "CharDelimiterSplit", "delimiter": "a"},
                                                        bl(use_regex=False))}),
        ("seq_bl_then_split", "bytelevel", {"pre_tokenizer": seq(bl(add_prefix_space=True),
                                                                split("\u0120", "MergedWithNext", literal=True))}),
        ("no_pretok", "bytelevel", {"pre_tokenizer": None}),
        ("added_flags", "bytelevel", {"added_tokens": added(b, changes=[
            ("<|im_end|>", {"lstrip": True, "rstrip": True}),
            ("<|im_start|>", {"single_word": True}),
            ("<|text_end|>", {"lstrip": True}),
            ("<|audio_start|>", {"rstrip": True, "single_word": True}),
        ])}),
        ("added_normalized", "bytelevel", {"normalizer": {"type": "Lowercase"}, "added_tokens": added(b, changes=[
            ("<|im_end|>", {"normalized": True, "special": False}),
        ], extra=[
            {"id": 1000, "content": "Hello", "normalized": True},
            {"id": 1001, "content": "WORLD", "normalized": False},
            {"id": 1002, "content": " the", "normalized": True, "lstrip": True},
            {"id": 1003, "content": "<|im_end|>x"},
            {"id": 1004, "content": "\u00e9t\u00e9", "normalized": True, "single_word": True},
        ])}),
        ("added_new_ids", "llama3split", {"added_tokens": added(bases["llama3split"], extra=[
            {"id": 5000, "content": "<tool>", "special": True},
            {"id": 5001, "content": "</tool>", "special": True},
            {"id": 5002, "content": "ab", "rstrip": True},
            {"id": 5003, "content": "abc"},
            {"id": 5004, "content": "  ", "special": False},
        ])}),
        ("ignore_merges", "bytelevel", {"model": {"ignore_merges": True}}),
        ("unk_fuse", "bytelevel", {"pre_tokenizer": {"type": "Whitespace"}, "decoder": None,
                                   "model": {"unk_token": "<|reserved_3|>", "fuse_unk": True}}),
        ("unk_nofuse", "bytelevel", {"pre_tokenizer": {"type": "Whitespace"}, "decoder": None,
                                     "model": {"unk_token": "<|reserved_3|>", "fuse_unk": False}}),
        ("byte_fallback", "bytelevel", {"pre_tokenizer": {"type": "WhitespaceSplit"},
                                        "model": {"byte_fallback": True, "unk_token": "<|reserved_3|>"},
                                        "vocab_add": BYTES,
                                        "decoder": dseq({"type": "ByteFallback"}, {"type": "Fuse"})}),
        ("metaspace_like_dec", "bytelevel", {
            "normalizer": nseq({"type": "Prepend", "prepend": "\u2581"},
                               {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}),
            "pre_tokenizer": None,
            "model": {"byte_fallback": True}, "vocab_add": BYTES,
            "decoder": dseq({"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                            {"type": "ByteFallback"}, {"type": "Fuse"},
                            {"type": "Strip", "content": " ", "start": 1, "stop": 0})}),
        ("dec_none", "bytelevel", {"decoder": None}),
        ("dec_strip_stop", "bytelevel", {"decoder": dseq(bl(), {"type": "Strip", "content": "a", "start": 1,
                                                                "stop": 1})}),
        ("dec_replace", "bytelevel", {"decoder": dseq({"type": "Replace", "pattern": {"Regex": "\u0120+"},
                                                       "content": "_"}, bl())}),
        ("dec_fused_replace", "bytelevel", {"decoder": dseq(bl(), {"type": "Replace",
                                                                   "pattern": {"String": "ab"}, "content": "X"})}),
        ("dec_fuse_strip_start", "bytelevel", {"decoder": dseq(bl(), {"type": "Strip", "content": " ",
                                                                      "start": 2, "stop": 0})}),
        ("dec_bpe", "bytelevel", {"decoder": {"type": "BPEDecoder", "suffix": "\u0120"}}),
        # Loads tokenizers should refuse (the Go side must refuse them too).
        ("bad_regex", "bytelevel", with_split(split(r"(unclosed", "Isolated"))),
        ("bad_merge", "bytelevel", {"model": {"merges": [["no_such_token", "x"]]}}),
    ]
    return v


def fixed_texts(goldens):
    texts = []
    for g in goldens:
        texts += [c["text"] for c in g["cases"]]
    texts += [
        "'s 'S 'ſ 'T 'Re 'LL it'ſ", "\u212a\u212a k K", "İstanbul ß ẞ ﬁne ﬀ", "１２３ ٣٤٥ ²³ Ⅻ ⅻ",
        "a\u0085b\u2028c\u2029d\u3000e\u000bf\u000cg\u001ch", "x\r\ny\r\rz\n\r", "a  \n  b \t\n c",
        "e\u0301\u0302 o\u0308 \u1100\u1161\u11a8 \ud55c\uad6d\uc5b4", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
        "<|im_end|><|im_end|> <|im_end|>  x <|im_start|>y<|im_start|> <|im_start|>",
        "<|audio_start|>x <|audio_start|> <|text_end|>  <|text_end|>", "a<|im_end|>b\t<|im_end|>\n",
        "Hello hello HELLO WORLD world the  the", "<|im_end|>x<|im_end|>xy", "été étés l'été",
        "abc ab abcab  ab  a b", "<tool>x</tool> <tool> abab", "1234567 12,345,678 1.5",
        "aaaa xxx axa", "ａｂｃ ＡＢＣ", "\u00a0\u00a0x\u00a0", "   ", "\t\t", "\n\n\n", " a", "a",
        "\u4e00\u4e8c\u4e09 \U0001F600\U0001F600", "0x1F 0XaB ghij", "don't DON'T Don'T", "\ufffd\ufffd",
    ]
    return texts


ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
            list("  \t\n\r.,;:!?'\"-_()[]{}<>|/\\@#$%^&*+=~`") +
            ["'s", "'t", "'re", "'ll", "'ſ", "\u00a0", "\u2028", "\u0085", "\u3000", "\u200b", "\u0301",
             "é", "ß", "İ", "ſ", "\u212a", "ﬁ", "１", "٣", "²", "Ⅻ", "日", "本", "語", "한", "\U0001F600",
             "\U0001F44D", "\U0001F3FD", "\u200d", "Ж", "ж", "م", "ر", "<|im_end|>", "<|im_start|>",
             "<|im_", "|>", "<|text_end|>", "<|reserved_7|>", "Hello", "WORLD", " the", "ab", "été"])


def random_texts(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        out.append("".join(rng.choice(ALPHABET) for _ in range(k)))
    return out


PANIC = "\x00panic"


def decode(tok, ids):
    """decode(ids), or PANIC where tokenizers panics (Strip's decoder indexes
    out of bounds on tokens shorter than its stop count)."""
    try:
        return tok.decode(ids, skip_special_tokens=False)
    except BaseException:  # pyo3's PanicException is not an Exception
        return PANIC


def build(base, patch):
    cfg = copy.deepcopy(base)
    for k, val in patch.items():
        if k == "model":
            cfg["model"].update(val)
        elif k == "vocab_add":
            cfg["model"]["vocab"].update(val)
        else:
            cfg[k] = val
    return cfg


def main():
    out_dir = sys.argv[1]
    bases = {k: json.load(open(p, encoding="utf-8")) for k, p in BASES.items()}
    goldens = [json.load(open(os.path.join(os.path.dirname(p), "golden.json"), encoding="utf-8"))
               for k, p in BASES.items() if k != "lfm2tiny"]
    rng = random.Random(20261129)
    texts = fixed_texts(goldens) + random_texts(rng, 300)
    probes = ["<|im_end|>", "<|im_start|>", "Hello", "WORLD", " the", "<tool>", "ab", "abc", "  ",
              "\u0120the", "the", "<0x41>", "<|reserved_3|>", "nope"]
    result = {"tokenizers_version": tokenizers.__version__, "texts": texts, "variants": []}
    for name, base, patch in variants(bases):
        rec = {"name": name, "base": base, "patch": patch}
        try:
            tok = Tokenizer.from_str(json.dumps(build(bases[base], patch)))
        except Exception as e:  # recorded: the Go side must refuse it too
            rec["load_error"] = str(e)
            result["variants"].append(rec)
            continue
        enc, dec = [], []
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            d = decode(tok, ids)
            enc.append(ids)
            dec.append(None if d == t else d)
        n = tok.get_vocab_size(with_added_tokens=True)
        rand_ids = [[rng.randrange(0, n + 8) for _ in range(rng.randint(1, 12))] for _ in range(60)]
        rec.update({
            "ids": enc,
            "decoded": dec,
            "random_ids": rand_ids,
            "random_decoded": [decode(tok, ids) for ids in rand_ids],
            "vocab_size": n,
            "token_to_id": {p: tok.token_to_id(p) for p in probes},
        })
        result["variants"].append(rec)
    path = os.path.join(out_dir, "conformance.json.gz")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, separators=(",", ":"))
    print(path, os.path.getsize(path), "bytes,", len(result["variants"]), "variants,", len(texts), "texts")


if __name__ == "__main__":
    main()
