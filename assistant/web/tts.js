// TTS panel: type text, pick a voice and options, listen while it streams over /ws/tts (Web Audio schedules
// each PCM chunk as it arrives), see first-packet and total time. Reference clips can be uploaded or
// recorded (MediaRecorder) and registered as voices. Plain modern JS module, no build step.
//
// Stable ids for tests: tts-text, tts-voice, tts-speed, tts-pitch, tts-energy, tts-language, tts-instruct,
// tts-speak, tts-stop, tts-status, tts-first-packet, tts-total, tts-audio-seconds, tts-error,
// tts-clip, tts-record, tts-transcript, tts-voice-name, tts-add-voice, tts-voices.

import { authHeaders, token } from './token.js';

const $ = (id) => document.getElementById(id);
const END = 'END';

const tts = {
  ws: null, ctx: null, playHead: 0, sources: new Set(), sampleRate: 0, t0: 0, firstAt: null,
  samples: 0, busy: false, clip: null, recorder: null, lastResult: null,
};
window.ttsState = tts;  // for tests and curious users

const LANGS = [['', 'default'], ['en', 'English'], ['zh', '中文'], ['ja', '日本語'], ['yue', '粵語'], ['ko', '한국어']];

function render(root) {
  root.innerHTML = `
    <h2>Text to speech</h2>
    <div class="tts-grid">
      <label class="tts-wide">Text
        <textarea id="tts-text" rows="3" maxlength="2000">Welcome to the voice assistant. How can I help you today?</textarea>
      </label>
      <label>Voice <select id="tts-voice"><option value="">default</option></select></label>
      <label>Language <select id="tts-language">${LANGS.map(([v, n]) => `<option value="${v}">${n}</option>`).join('')}</select></label>
      <label>Instruction <input id="tts-instruct" type="text" maxlength="500" placeholder="e.g. Speak cheerfully (CosyVoice)"></label>
      <label>Speed <input id="tts-speed" type="range" min="0.25" max="4" step="0.05" value="1"> <output id="tts-speed-v">1.00</output></label>
      <label>Pitch <input id="tts-pitch" type="range" min="-12" max="12" step="1" value="0"> <output id="tts-pitch-v">0</output> st</label>
      <label>Energy <input id="tts-energy" type="range" min="0.5" max="2" step="0.05" value="1"> <output id="tts-energy-v">1.00</output></label>
    </div>
    <div class="tts-controls">
      <button id="tts-speak">Speak</button>
      <button id="tts-stop" disabled>Stop</button>
      <span id="tts-status" class="tts-status">idle</span>
    </div>
    <dl class="tts-times">
      <div><dt>first packet</dt><dd id="tts-first-packet">–</dd></div>
      <div><dt>total</dt><dd id="tts-total">–</dd></div>
      <div><dt>audio</dt><dd id="tts-audio-seconds">–</dd></div>
    </dl>
    <div id="tts-error" class="error" hidden></div>
    <details class="tts-clone">
      <summary>Add a voice from a reference clip</summary>
      <div class="tts-grid">
        <label>Clip (3–30 s) <input id="tts-clip" type="file" accept="audio/*"></label>
        <label>or <button id="tts-record" type="button">Record</button> <span id="tts-clip-info"></span></label>
        <label class="tts-wide">What the clip says <input id="tts-transcript" type="text" maxlength="2000"></label>
        <label>Name <input id="tts-voice-name" type="text" maxlength="64"></label>
      </div>
      <button id="tts-add-voice">Add voice</button>
      <ul id="tts-voices" class="tts-voices"></ul>
    </details>`;
  for (const id of ['speed', 'pitch', 'energy']) {
    const input = $(`tts-${id}`);
    const out = $(`tts-${id}-v`);
    input.addEventListener('input', () => { out.textContent = id === 'pitch' ? input.value : Number(input.value).toFixed(2); });
  }
  $('tts-speak').addEventListener('click', speak);
  $('tts-stop').addEventListener('click', stop);
  $('tts-clip').addEventListener('change', () => { tts.clip = $('tts-clip').files[0] || null; showClip(); });
  $('tts-record').addEventListener('click', toggleRecord);
  $('tts-add-voice').addEventListener('click', addVoice);
}

function setStatus(text) { $('tts-status').textContent = text; }
function showError(text) { const e = $('tts-error'); e.textContent = text || ''; e.hidden = !text; }
const ms = (x) => `${Math.round(x)} ms`;

// --- voices -------------------------------------------------------------------------------------------
async function loadVoices() {
  try {
    const res = await fetch('/api/voices', { headers: authHeaders() });
    if (!res.ok) return;
    const data = await res.json();
    const select = $('tts-voice');
    const keep = select.value;
    select.innerHTML = '<option value="">default</option>';
    const list = $('tts-voices');
    list.innerHTML = '';
    for (const v of data.voices) {
      const opt = document.createElement('option');
      opt.value = v.voice_id;
      opt.textContent = v.cloning ? v.name : `${v.name} (needs a cloning engine)`;
      opt.disabled = !v.cloning;
      select.appendChild(opt);
      const li = document.createElement('li');
      li.textContent = `${v.name} · ${v.duration_s.toFixed(1)} s `;
      const del = document.createElement('button');
      del.textContent = 'delete';
      del.addEventListener('click', async () => {
        await fetch(`/api/voices/${encodeURIComponent(v.voice_id)}`, { method: 'DELETE', headers: authHeaders() });
        loadVoices();
      });
      li.appendChild(del);
      list.appendChild(li);
    }
    select.value = [...select.options].some((o) => o.value === keep) ? keep : '';
  } catch (err) {
    console.warn('tts: could not list voices', err);
  }
}

function showClip() {
  $('tts-clip-info').textContent = tts.clip ? `${tts.clip.name || 'recording'} · ${(tts.clip.size / 1024).toFixed(0)} KiB` : '';
}

async function toggleRecord() {
  const btn = $('tts-record');
  if (tts.recorder) { tts.recorder.stop(); return; }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const rec = new MediaRecorder(stream);
    const parts = [];
    rec.ondataavailable = (e) => { if (e.data.size) parts.push(e.data); };
    rec.onstop = () => {
      stream.getTracks().forEach((t) => t.stop());
      const type = rec.mimeType || 'audio/webm';
      tts.clip = new File(parts, `recording.${type.includes('ogg') ? 'ogg' : 'webm'}`, { type });
      tts.recorder = null;
      btn.textContent = 'Record';
      showClip();
    };
    rec.start();
    tts.recorder = rec;
    btn.textContent = 'Stop recording';
  } catch (err) {
    showError(`microphone: ${err.message}`);
  }
}

async function addVoice() {
  showError('');
  if (!tts.clip) { showError('choose or record a clip first'); return; }
  const form = new FormData();
  form.append('clip', tts.clip, tts.clip.name || 'clip');
  form.append('transcript', $('tts-transcript').value);
  form.append('name', $('tts-voice-name').value);
  const res = await fetch('/api/voices', { method: 'POST', body: form, headers: authHeaders() });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) { showError(`${body.error || res.status}: ${body.detail || ''}`); return; }
  if (!body.cloning) showError('stored, but this server\'s engine cannot clone voices');
  await loadVoices();
  if (body.cloning) $('tts-voice').value = body.voice_id;
}

// --- speaking -----------------------------------------------------------------------------------------
function request() {
  const body = { text: $('tts-text').value };
  const voice = $('tts-voice').value;
  if (voice) body.voice = voice;
  const lang = $('tts-language').value;
  if (lang) body.language = lang;
  const instruct = $('tts-instruct').value.trim();
  if (instruct) body.instruct = instruct;
  for (const id of ['speed', 'pitch', 'energy']) {
    const v = Number($(`tts-${id}`).value);
    if (v !== (id === 'pitch' ? 0 : 1)) body[id] = v;
  }
  return body;
}

function socket() {
  if (tts.ws && tts.ws.readyState <= WebSocket.OPEN) return Promise.resolve(tts.ws);
  return new Promise((resolve, reject) => {
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    // Opt into the start message (it carries the sample rate) and into keep_open (errors leave the socket up).
    const q = new URLSearchParams({ metadata: '1', keep_open: '1' });
    if (token) q.set('token', token);
    const ws = new WebSocket(`${proto}://${location.host}/ws/tts?${q}`);
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => resolve(ws);
    ws.onerror = () => reject(new Error('could not open /ws/tts'));
    ws.onclose = () => { if (tts.ws === ws) tts.ws = null; if (tts.busy) finish('connection closed'); };
    ws.onmessage = onMessage;
    tts.ws = ws;
  });
}

async function speak() {
  if (tts.busy) return;
  showError('');
  if (!tts.ctx) tts.ctx = new AudioContext();
  await tts.ctx.resume();
  for (const s of tts.sources) s.stop();
  tts.sources.clear();
  Object.assign(tts, { busy: true, t0: performance.now(), firstAt: null, samples: 0, sampleRate: 0, playHead: 0 });
  $('tts-first-packet').textContent = '…';
  $('tts-total').textContent = '…';
  $('tts-audio-seconds').textContent = '…';
  $('tts-speak').disabled = true;
  $('tts-stop').disabled = false;
  setStatus('synthesizing');
  try {
    const ws = await socket();
    tts.t0 = performance.now();
    ws.send(JSON.stringify(request()));
  } catch (err) {
    finish(err.message);
  }
}

function stop() {
  if (tts.busy && tts.ws) tts.ws.send(JSON.stringify({ type: 'cancel' }));
  for (const s of tts.sources) s.stop();
  tts.sources.clear();
}

function onMessage(ev) {
  if (typeof ev.data === 'string') {
    const msg = JSON.parse(ev.data);
    if (msg.type === 'start') { tts.sampleRate = msg.sample_rate; return; }
    if (msg.error) finish(`${msg.error}: ${msg.detail}`);
    return;
  }
  const bytes = new Uint8Array(ev.data);
  if (bytes.length === 3 && String.fromCharCode(...bytes) === END) { finish(null); return; }
  if (tts.firstAt === null) {
    tts.firstAt = performance.now();
    $('tts-first-packet').textContent = ms(tts.firstAt - tts.t0);
    setStatus('playing');
  }
  play(new Int16Array(ev.data));
}

function play(pcm) {
  // s16le → float, scheduled right after the previous chunk so chunks play gaplessly as they arrive.
  const ctx = tts.ctx;
  const buf = ctx.createBuffer(1, pcm.length, tts.sampleRate);
  const ch = buf.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(ctx.destination);
  const at = Math.max(ctx.currentTime + 0.02, tts.playHead);
  src.start(at);
  tts.playHead = at + buf.duration;
  tts.samples += pcm.length;
  tts.sources.add(src);
  src.onended = () => tts.sources.delete(src);
}

function finish(error) {
  if (!tts.busy) return;
  tts.busy = false;
  const total = performance.now() - tts.t0;
  $('tts-total').textContent = ms(total);
  if (tts.firstAt === null) $('tts-first-packet').textContent = '–';
  const seconds = tts.sampleRate ? tts.samples / tts.sampleRate : 0;
  $('tts-audio-seconds').textContent = `${seconds.toFixed(2)} s`;
  $('tts-speak').disabled = false;
  $('tts-stop').disabled = true;
  tts.lastResult = { error, firstPacketMs: tts.firstAt === null ? null : tts.firstAt - tts.t0, totalMs: total,
    audioSeconds: seconds, sampleRate: tts.sampleRate };
  setStatus(error ? 'error' : 'done');
  if (error) showError(error);
}

const root = $('tts-panel');
if (root) {
  render(root);
  loadVoices();
}
