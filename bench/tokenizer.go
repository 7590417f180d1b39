package bench

import (
	"encoding/json"
	"fmt"
)

// specialTokens are LFM2's special tokens at their ids (as in the released
// tokenizer.json of LiquidAI/LFM2-Audio-1.5B on Hugging Face); every
// other id below numSpecial is <|reserved_N|>.
var specialTokens = map[int]string{
	0: "<|pad|>", 1: "<|startoftext|>", 2: "<|endoftext|>",
	3: "<|fim_pre|>", 4: "<|fim_mid|>", 5: "<|fim_suf|>",
	6: "<|im_start|>", 7: "<|im_end|>",
	8: "<|tool_list_start|>", 9: "<|tool_list_end|>", 10: "<|tool_call_start|>",
	11: "<|tool_call_end|>", 12: "<|tool_response_start|>", 13: "<|tool_response_end|>",
	128: "<|audio_start|>", 129: "<|text_start|>", 130: "<|text_end|>",
	131: "<|mixed_start|>", 132: "<|mixed_end|>",
}

// numSpecial is the number of leading special ids (as in the fixtures'
// tokenizer: 0 … 135).
const numSpecial = 136

// byteAlphabet is GPT-2's bytes_to_unicode: the printable character that
// stands for each byte in a byte-level BPE vocabulary.
func byteAlphabet() [256]rune {
	var a [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae {
			a[b] = rune(b)
		} else {
			a[b] = rune(256 + n)
			n++
		}
	}
	return a
}

// TokenizerJSON returns a minimal valid byte-level BPE tokenizer.json with
// exactly vocab ids: LFM2's special tokens at their ids (0 … 135, the rest
// reserved), the 256 byte tokens, then merged tokens — pairs and triples of
// letters and the space mark 'Ġ', in merge order — until the vocabulary is
// full. Every token decodes to text, so a random-weight model's output
// decodes as well.
func TokenizerJSON(vocab int) ([]byte, error) {
	if least := numSpecial + 256; vocab < least {
		return nil, fmt.Errorf("tokenizer: vocabulary of %d ids; a byte-level BPE with LFM2's special tokens needs at least %d", vocab, least)
	}
	ids := make(map[string]int, vocab)
	var added []map[string]any
	for id := 0; id < numSpecial; id++ {
		s, ok := specialTokens[id]
		if !ok {
			s = fmt.Sprintf("<|reserved_%d|>", id)
		}
		ids[s] = id
		added = append(added, map[string]any{"id": id, "content": s, "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	bytesTo := byteAlphabet()
	for b := 0; b < 256; b++ {
		ids[string(bytesTo[b])] = len(ids)
	}
	var letters []string
	for _, r := range "ĠabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" {
		letters = append(letters, string(r))
	}
	merges := [][2]string{}
	merge := func(a, b string) bool {
		if len(ids) >= vocab {
			return false
		}
		ids[a+b] = len(ids)
		merges = append(merges, [2]string{a, b})
		return true
	}
	pairs := make([]string, 0, len(letters)*len(letters))
fill:
	for _, a := range letters {
		for _, b := range letters {
			if !merge(a, b) {
				break fill
			}
			pairs = append(pairs, a+b)
		}
	}
triples:
	for _, p := range pairs {
		for _, c := range letters {
			if !merge(p, c) {
				break triples
			}
		}
	}
	if len(ids) != vocab {
		return nil, fmt.Errorf("tokenizer: made %d of %d ids", len(ids), vocab)
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	doc := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  byteLevel,
		"post_processor": nil,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": ids, "merges": merges,
		},
	}
	return json.Marshal(doc)
}
