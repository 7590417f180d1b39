// Package bench measures where omni-pipe's time goes, stage by stage, and
// builds the synthetic checkpoints it measures with.
//
// A synthetic checkpoint (Checkpoint) is a complete LFM2-Audio model folder
// — config.json, tokenizer.json, model.safetensors, mimi.safetensors and
// mimi_config.json — with seeded random weights at any size, by default the
// released LFM2-Audio-1.5B's (Real). Every tensor name and shape follows the
// layout of the released checkpoint (LiquidAI/LFM2-Audio-1.5B's
// model.safetensors and Kyutai's Mimi weights), so the strict loader
// (stages/lfm2audio) accepts it exactly as it accepts the released files,
// and the networks run real-size work on it. Three gigabytes of bf16 weights
// are drawn in parallel from a table of normal quantiles indexed by a
// SplitMix64 stream, a few seconds on two cores.
//
// Run drives real turns through the engine (pipeline.Engine with a Trace)
// and turns the stage intervals into a Report: per-stage median and p90,
// the front end's cost per second of input, the backbone⇄depthformer loop
// per 80 ms frame against its memory-bandwidth floor, time to first text
// and audio, the real-time factor, and how much of the codec's work hid
// behind the backbone's. `omni-pipe bench` prints it; docs/performance.md
// records it.
package bench
