// omni-pipe's browser client for /v1/realtime (OpenAI Realtime API, GA
// events). No build step, no dependencies: getUserMedia and an AudioWorklet
// capture the microphone at 24 kHz PCM16; WebAudio plays the reply through
// a small jitter buffer; speech during a reply stops it (barge-in) and tells
// the server how much was heard (conversation.item.truncate).
"use strict";

const JITTER_S = 0.12; // audio held back before a reply starts playing
const $ = (id) => document.getElementById(id);

// The page's state, also read by the browser test (window.omni).
const omni = {
  connected: false,
  turns: 0, // responses that produced audio
  responsesDone: 0,
  transcript: "", // every assistant transcript, in order
  scheduledMs: 0, // reply audio scheduled for playback, all turns
  bargeIns: 0, // replies stopped because the user spoke
  playbackStopped: 0, // times playback was cut short
  latencies: [], // ms from end of speech to first reply audio, per turn
  errors: [],
  lastMessage: "",
  events: {},
  playing: () => sources.size > 0 && ctx !== null && playhead > ctx.currentTime,
};
window.omni = omni;

let ws = null;
let ctx = null;
let mic = null;
let node = null;
let closing = false;
let mode = "hands-free";
let talking = false; // push-to-talk held
let playhead = 0; // ctx time at which the next chunk starts
const sources = new Set();
let reply = null; // {itemId, startAt, scheduledMs, el, firstAudio}
let speechEndAt = 0; // performance.now() of the end of the user's speech

function show(msg, kind) {
  const el = $("message");
  el.textContent = msg;
  el.className = "show" + (kind === "info" ? " info" : "");
  omni.lastMessage = msg;
}
function hideMessage() { $("message").className = ""; }
function setStatus(s) { const el = $("status"); el.textContent = s; el.className = s; }

function addTurn(who, text) {
  const div = document.createElement("div");
  div.className = "turn " + who;
  div.innerHTML = '<span class="who"></span><span class="text"></span><span class="meta"></span>';
  div.querySelector(".who").textContent = who === "user" ? "You:" : "Model:";
  div.querySelector(".text").textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function send(ev) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(ev));
}

function b64FromInt16(buf) {
  const bytes = new Uint8Array(buf);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}
function floatsFromB64(b64) {
  const bin = atob(b64);
  const n = bin.length >> 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 32768;
  }
  return out;
}

// Playback.
function schedule(pcm) {
  const buf = ctx.createBuffer(1, pcm.length, 24000);
  buf.copyToChannel(pcm, 0);
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(ctx.destination);
  const now = ctx.currentTime;
  if (playhead < now + 0.01) playhead = now + JITTER_S; // (re)fill the jitter buffer
  if (reply && reply.startAt === null) reply.startAt = playhead;
  src.start(playhead);
  playhead += buf.duration;
  sources.add(src);
  src.onended = () => sources.delete(src);
  const ms = (pcm.length / 24000) * 1000;
  omni.scheduledMs += ms;
  if (reply) reply.scheduledMs += ms;
}

// stopPlayback silences the reply now and returns the ms of it played.
function stopPlayback() {
  let played = 0;
  if (reply && reply.startAt !== null) {
    played = Math.max(0, Math.min(reply.scheduledMs, (ctx.currentTime - reply.startAt) * 1000));
  }
  const had = sources.size > 0;
  for (const s of sources) { try { s.stop(); } catch (e) { /* already stopped */ } }
  sources.clear();
  playhead = 0;
  if (had) omni.playbackStopped++;
  return Math.floor(played);
}

function onEvent(ev) {
  omni.events[ev.type] = (omni.events[ev.type] || 0) + 1;
  switch (ev.type) {
    case "session.created":
      send({ type: "session.update", session: { type: "realtime", audio: { input: { turn_detection: mode === "hands-free" ? { type: "server_vad" } : null } } } });
      break;
    case "input_audio_buffer.speech_started": {
      setStatus("speaking");
      if (reply && omni.playing()) {
        // Barge-in: stop the reply and say how much of it was heard.
        const played = stopPlayback();
        omni.bargeIns++;
        if (reply.el) reply.el.classList.add("cut");
        send({ type: "conversation.item.truncate", item_id: reply.itemId, content_index: 0, audio_end_ms: played });
      }
      break;
    }
    case "input_audio_buffer.speech_stopped":
      speechEndAt = performance.now();
      setStatus("replying");
      break;
    case "conversation.item.added":
      if (ev.item.role === "user") {
        const txt = ev.item.content.map((c) => c.type === "input_text" ? c.text : "(speech)").join(" ");
        addTurn("user", txt);
      }
      break;
    case "response.created":
      reply = { itemId: null, startAt: null, scheduledMs: 0, el: null, firstAudio: false };
      break;
    case "response.output_item.added":
      if (reply) { reply.itemId = ev.item.id; reply.el = addTurn("assistant", ""); }
      break;
    case "response.output_audio_transcript.delta":
      omni.transcript += ev.delta;
      if (reply && reply.el) reply.el.querySelector(".text").textContent += ev.delta;
      break;
    case "response.output_audio.delta":
      if (!reply || !ctx) break;
      if (!reply.firstAudio) {
        reply.firstAudio = true;
        omni.turns++;
        if (speechEndAt > 0) {
          const ms = Math.round(performance.now() - speechEndAt);
          omni.latencies.push(ms);
          $("latency").textContent = "latency " + ms + " ms";
          if (reply.el) reply.el.querySelector(".meta").textContent = ms + " ms";
          speechEndAt = 0;
        }
      }
      schedule(floatsFromB64(ev.delta));
      break;
    case "response.done": {
      omni.responsesDone++;
      const r = ev.response;
      if (r.status === "failed" && r.status_details && r.status_details.error) {
        // The error event before it says why.
      }
      if (reply && reply.el && r.status === "cancelled") reply.el.classList.add("cut");
      setStatus(talking ? "speaking" : "listening");
      break;
    }
    case "error": {
      const e = ev.error || {};
      omni.errors.push(e.code || e.type);
      if (e.code === "rate_limit_exceeded" || e.code === "too_many_sessions") {
        show("The server is overloaded (" + e.message + "). Try again in a moment.");
      } else {
        show("Server error: " + (e.message || e.code));
      }
      break;
    }
  }
}

async function startMic() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("This browser cannot capture audio here (the page needs https:// or localhost).");
  }
  try {
    mic = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 } });
  } catch (e) {
    if (e.name === "NotAllowedError" || e.name === "SecurityError") {
      throw new Error("Microphone access was denied. Allow the microphone for this page (the icon in the address bar) and press Start again.");
    }
    if (e.name === "NotFoundError") throw new Error("No microphone was found. Plug one in and press Start again.");
    throw new Error("The microphone could not be opened: " + e.message);
  }
  await ctx.audioWorklet.addModule("/web/mic-worklet.js");
  const srcNode = ctx.createMediaStreamSource(mic);
  node = new AudioWorkletNode(ctx, "mic-resampler");
  const levelEl = $("level");
  node.port.onmessage = (m) => {
    const pcm = new Int16Array(m.data);
    let peak = 0;
    for (let i = 0; i < pcm.length; i += 16) peak = Math.max(peak, Math.abs(pcm[i]));
    levelEl.style.width = Math.min(100, (peak / 32768) * 300) + "%";
    if (mode === "hands-free" || talking) send({ type: "input_audio_buffer.append", audio: b64FromInt16(m.data) });
  };
  srcNode.connect(node);
}

function connect() {
  return new Promise((resolve, reject) => {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const key = $("key").value.trim();
    const protocols = ["realtime"];
    if (key) protocols.push("openai-insecure-api-key." + key);
    let opened = false;
    ws = new WebSocket(proto + "//" + location.host + "/v1/realtime", protocols);
    ws.onopen = () => { opened = true; omni.connected = true; resolve(); };
    ws.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch (e) { console.error(e); } };
    ws.onclose = (e) => {
      omni.connected = false;
      if (!opened) { reject(new Error("Could not connect to the server (" + (e.code || "no answer") + "). Is it running, and is the API key right?")); return; }
      if (closing) return;
      if (e.code === 1013) show("The server is overloaded: it is serving its maximum of sessions. Try again in a moment.");
      else show("The connection to the server was lost (code " + e.code + (e.reason ? ", " + e.reason : "") + "). Press Start to reconnect.");
      teardown();
    };
  });
}

async function start() {
  hideMessage();
  closing = false;
  mode = document.querySelector("input[name=mode]:checked").value;
  $("start").disabled = true;
  try {
    ctx = new AudioContext();
    await ctx.resume();
    await startMic();
    await connect();
  } catch (e) {
    show(e.message);
    teardown();
    return;
  }
  $("stop").disabled = false;
  $("talk").disabled = mode !== "push-to-talk";
  setStatus(mode === "hands-free" ? "listening" : "idle");
}

function teardown() {
  closing = true;
  if (ws) { try { ws.close(); } catch (e) { /* closed */ } ws = null; }
  if (mic) { mic.getTracks().forEach((t) => t.stop()); mic = null; }
  if (node) { node.disconnect(); node = null; }
  stopPlayback();
  if (ctx) { ctx.close(); ctx = null; }
  omni.connected = false;
  $("start").disabled = false;
  $("stop").disabled = true;
  $("talk").disabled = true;
  setStatus("idle");
}

// Push-to-talk: audio goes out while the button (or space) is held; the
// release commits it and asks for the reply.
function talkDown() {
  if (mode !== "push-to-talk" || talking || !ws) return;
  if (reply && omni.playing()) {
    const played = stopPlayback();
    omni.bargeIns++;
    send({ type: "response.cancel" });
    send({ type: "conversation.item.truncate", item_id: reply.itemId, content_index: 0, audio_end_ms: played });
  }
  talking = true;
  $("talk").classList.add("held");
  send({ type: "input_audio_buffer.clear" });
  setStatus("speaking");
}
function talkUp() {
  if (!talking) return;
  talking = false;
  $("talk").classList.remove("held");
  speechEndAt = performance.now();
  send({ type: "input_audio_buffer.commit" });
  send({ type: "response.create" });
  setStatus("replying");
}

$("start").onclick = start;
$("stop").onclick = teardown;
$("talk").onpointerdown = talkDown;
$("talk").onpointerup = talkUp;
$("talk").onpointerleave = talkUp;
document.addEventListener("keydown", (e) => { if (e.code === "Space" && !e.repeat && mode === "push-to-talk" && ws) { e.preventDefault(); talkDown(); } });
document.addEventListener("keyup", (e) => { if (e.code === "Space") talkUp(); });
const saved = localStorage.getItem("omnipipe-key");
if (saved) $("key").value = saved;
$("key").onchange = () => localStorage.setItem("omnipipe-key", $("key").value.trim());
