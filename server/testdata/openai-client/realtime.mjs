// Drives omni-pipe's /v1/realtime with the official openai SDK's realtime
// WebSocket client (OpenAIRealtimeWS, on the ws package), as a voice app
// would: a spoken turn the server VAD detects and answers, then a second
// one interrupted by speech (barge-in), then a truncation to what was
// "played". Prints what happened as one JSON object for the Go test
// (server/realtime_sdk_test.go).
//
//   node realtime.mjs BASE_URL SPEECH_PCM16_24K
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { OpenAIRealtimeWS } from "openai/realtime/ws";

const [baseURL, speechPath] = process.argv.slice(2);
if (!baseURL || !speechPath) {
  console.error("usage: node realtime.mjs BASE_URL SPEECH_PCM16_24K");
  process.exit(2);
}
const speech = readFileSync(speechPath);
const client = new OpenAI({ baseURL, apiKey: "sdk-key", maxRetries: 0 });
const rt = new OpenAIRealtimeWS({ model: "lfm2-audio" }, client);
const out = { events: {}, turns: [], errors: [], truncated: [] };
let turn = null;

// speak sends the speech as fast as it goes or, paced after its first
// second, in real time as a microphone would (the reply, generated faster
// than real time, is still running when the onset arrives, and the client's
// truncate arrives while the user still speaks).
async function speak(paced) {
  const chunk = 24000 * 2 * 0.04; // 40 ms of PCM16
  for (let i = 0, n = 0; i < speech.length; i += chunk, n++) {
    rt.send({ type: "input_audio_buffer.append", audio: speech.subarray(i, i + chunk).toString("base64") });
    if (paced && n >= 25) await new Promise((r) => setTimeout(r, 40));
  }
}

const timer = setTimeout(() => { out.timeout = true; finish(); }, 45_000);
function finish() {
  clearTimeout(timer);
  rt.close();
  console.log(JSON.stringify(out));
}

rt.on("error", (err) => { out.errors.push(err.message); });
rt.on("event", (ev) => { out.events[ev.type] = (out.events[ev.type] || 0) + 1; });
rt.socket.on("open", () => { out.opened = true; });
rt.on("session.created", (ev) => {
  out.session = { id: ev.session.id, turn_detection: ev.session.audio.input.turn_detection.type };
  rt.send({ type: "session.update", session: { type: "realtime", max_output_tokens: 200, audio: { input: { turn_detection: { type: "server_vad", silence_duration_ms: 500 } } } } });
});
rt.on("session.updated", (ev) => {
  if (out.updated) return;
  out.updated = { max_output_tokens: ev.session.max_output_tokens, silence_duration_ms: ev.session.audio.input.turn_detection.silence_duration_ms };
  speak();
});
rt.on("input_audio_buffer.speech_started", () => { if (turn && !turn.done) turn.bargedIn = true; });
rt.on("response.created", (ev) => {
  turn = { id: ev.response.id, audio_bytes: 0, deltas: 0, transcript: "", done: false };
  out.turns.push(turn);
});
rt.on("response.output_item.added", (ev) => { turn.item_id = ev.item.id; });
rt.on("response.output_audio_transcript.delta", (ev) => { turn.transcript += ev.delta; });
rt.on("response.output_audio.delta", (ev) => {
  turn.audio_bytes += Buffer.from(ev.delta, "base64").length;
  turn.deltas++;
  if (out.turns.length === 2 && turn.deltas === 5) speak(true); // barge in on the second reply
});
rt.on("response.done", (ev) => {
  turn.done = true;
  turn.status = ev.response.status;
  turn.reason = ev.response.status_details?.reason ?? null;
  turn.usage = ev.response.usage;
  if (out.turns.length === 1) speak(); // the second turn
});
rt.on("conversation.item.truncated", (ev) => {
  out.truncated.push({ item_id: ev.item_id, audio_end_ms: ev.audio_end_ms });
  if (out.truncated.length === 1) {
    // The app played only 80 ms of what it was sent.
    rt.send({ type: "conversation.item.truncate", item_id: ev.item_id, content_index: 0, audio_end_ms: 80 });
  } else {
    finish();
  }
});
