package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

func init() {
	register(&command{
		name:    "tokenize",
		summary: "Read text from stdin and print its token ids (like llama-tokenize): encode(text, add_special_tokens=False).",
		usage:   "(--model DIR|owner/name | --tokenizer FILE) [--json]",
		setup: func(fs *flag.FlagSet, e *env) func([]string) error {
			model := fs.String("model", "", "checkpoint folder (its tokenizer.json), or a Hugging Face repo id owner/name[@revision]")
			offline := fs.Bool("offline", false, "never touch the network: a --model repo id must be in the Hugging Face cache")
			file := fs.String("tokenizer", "", "a tokenizer.json file")
			asJSON := fs.Bool("json", false, "print a JSON array")
			pieces := fs.Bool("pieces", false, "print each id with its token")
			return func(args []string) error {
				if err := noArgs(args); err != nil {
					return err
				}
				path := *file
				switch {
				case path == "" && *model == "":
					return usageError{"one of --model or --tokenizer is required"}
				case path != "" && *model != "":
					return usageError{"--model and --tokenizer are exclusive"}
				case path == "":
					dir, _, err := resolveModel(*model, e.getenv, *offline, e.stderr)
					if err != nil {
						return err
					}
					path = filepath.Join(dir, "tokenizer.json")
				}
				tok, err := tokenizer.Load(path)
				if err != nil {
					return err
				}
				in, err := io.ReadAll(e.stdin)
				if err != nil {
					return err
				}
				ids := tok.Encode(string(in))
				switch {
				case *asJSON:
					if ids == nil {
						ids = []int{} // [], not null
					}
					b, err := json.Marshal(ids)
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, string(b))
				case *pieces:
					for _, id := range ids {
						fmt.Fprintf(e.stdout, "%6d -> %q\n", id, tok.Token(id))
					}
				default:
					s := make([]string, len(ids))
					for i, id := range ids {
						s[i] = fmt.Sprint(id)
					}
					fmt.Fprintln(e.stdout, strings.Join(s, " "))
				}
				return nil
			}
		},
	})
}
