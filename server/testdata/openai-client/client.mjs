// Drives omni-pipe's /v1/chat/completions with the official openai SDK, as
// a user's program would, and prints what it got as one JSON object for the
// Go test (server/openai_test.go) to check.
//
//   node client.mjs BASE_URL WAV_FILE
import { readFileSync } from "node:fs";
import OpenAI from "openai";

const [baseURL, wavPath] = process.argv.slice(2);
if (!baseURL || !wavPath) {
  console.error("usage: node client.mjs BASE_URL WAV_FILE");
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const model = "lfm2-audio";
const wav = readFileSync(wavPath).toString("base64");
const speech = { role: "user", content: [{ type: "input_audio", input_audio: { data: wav, format: "wav" } }] };
const out = {};

// Speech in; text and a WAV out.
const r1 = await client.chat.completions.create({
  model,
  modalities: ["text", "audio"],
  audio: { voice: "alloy", format: "wav" },
  messages: [speech],
  max_tokens: 24,
  temperature: 0,
  seed: 1,
});
const m1 = r1.choices[0].message;
out.nonStream = {
  object: r1.object,
  model: r1.model,
  finish_reason: r1.choices[0].finish_reason,
  transcript: m1.audio.transcript,
  audio_id: m1.audio.id,
  expires_at: m1.audio.expires_at,
  wav_bytes: Buffer.from(m1.audio.data, "base64").length,
  usage: r1.usage,
};

// The same, streamed: transcript deltas and pcm16 chunks.
const stream = await client.chat.completions.create({
  model,
  modalities: ["text", "audio"],
  audio: { voice: "alloy", format: "pcm16" },
  messages: [speech],
  max_tokens: 24,
  temperature: 0,
  seed: 1,
  stream: true,
  stream_options: { include_usage: true },
});
const s = { transcript: "", pcm_bytes: 0, chunks: 0, audio_chunks: 0, finish_reason: null, usage: null, audio_id: null, role: null };
for await (const chunk of stream) {
  s.chunks++;
  if (chunk.usage) s.usage = chunk.usage;
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta?.role) s.role = c.delta.role;
  const a = c.delta?.audio;
  if (a?.transcript) s.transcript += a.transcript;
  if (a?.data) {
    s.pcm_bytes += Buffer.from(a.data, "base64").length;
    s.audio_chunks++;
  }
  if (a?.id) s.audio_id = a.id;
  if (c.finish_reason) s.finish_reason = c.finish_reason;
}
out.stream = s;

// A second turn that refers to the first reply by its audio id.
const r3 = await client.chat.completions.create({
  model,
  modalities: ["text", "audio"],
  audio: { voice: "alloy", format: "wav" },
  messages: [speech, { role: "assistant", audio: { id: m1.audio.id } }, { role: "user", content: "And then?" }],
  max_tokens: 12,
  temperature: 0,
});
out.followUp = { audio_id: r3.choices[0].message.audio.id, transcript: r3.choices[0].message.audio.transcript };

// Text in, text out.
const r4 = await client.chat.completions.create({
  model,
  messages: [{ role: "system", content: "Respond with interleaved text and audio." }, { role: "user", content: "Hello!" }],
  max_tokens: 12,
  temperature: 0,
});
out.textOnly = { content: r4.choices[0].message.content, audio: r4.choices[0].message.audio ?? null };

// A bad request surfaces as the SDK's APIError.
try {
  await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], temperature: -1 });
  out.error = null;
} catch (e) {
  out.error = { name: e.constructor.name, status: e.status, code: e.code, param: e.param, type: e.type, request_id: e.requestID ?? null };
}

out.models = (await client.models.list()).data.map((m) => m.id);
console.log(JSON.stringify(out));
