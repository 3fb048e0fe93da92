// Voice chat page: one WebRTC peer to the server, the `events` data channel, transcripts, and latency
// as this page hears it. Plain modern JS, no build step.

let STAGES = [];  // [name, colour, label] of each server stage, from GET /api/stages (pipeline/trace.py)

const $ = (id) => document.getElementById(id);
const state = { pc: null, channel: null, sessionId: null, ctx: null, stream: null, probe: null,
  lastMicLoud: null, armedSince: null, turns: new Map(), botMsg: null, partialMsg: null };
window.assistantState = state;  // for tests and curious users

function setStatus(text, live = false) { const s = $('status'); s.textContent = text; s.classList.toggle('live', live); }
function showError(text) { const e = $('error'); e.textContent = text; e.hidden = !text; }

function addMsg(who, text, cls = '') {
  const div = document.createElement('div');
  div.className = `msg ${who} ${cls}`.trim();
  div.textContent = text;
  $('transcript').appendChild(div);
  $('transcript').scrollTop = $('transcript').scrollHeight;
  return div;
}

function turnRow(turn) {
  let t = state.turns.get(turn);
  if (!t) {
    const tr = document.createElement('tr');
    tr.dataset.turn = turn;
    tr.innerHTML = `<td>${turn}</td><td class="num v2v">…</td><td class="num server">…</td><td><div class="bar"></div></td>`;
    $('turns').querySelector('tbody').prepend(tr);
    t = { tr, v2v: null, metrics: null };
    state.turns.set(turn, t);
  }
  return t;
}

function renderBar(t) {
  const d = t.metrics?.durations_ms || {};
  const total = Math.max(1, ...[t.v2v || 0, d.server_v2v_ms || 0]);
  const bar = t.tr.querySelector('.bar');
  bar.innerHTML = '';
  for (const [name, color, label] of STAGES) {
    if (!(name in d)) continue;
    const span = document.createElement('span');
    span.style.width = `${(100 * Math.max(0, d[name])) / total}%`;
    span.style.background = color;
    span.title = `${label}: ${d[name].toFixed(0)} ms`;
    bar.appendChild(span);
  }
  t.tr.querySelector('.server').textContent = d.server_v2v_ms != null ? `${d.server_v2v_ms.toFixed(0)} ms` : '…';
  t.tr.querySelector('.v2v').textContent = t.v2v != null ? `${t.v2v.toFixed(0)} ms` : '…';
}

function onEvent(ev) {
  switch (ev.type) {
    case 'session': state.sessionId = ev.session_id; break;
    case 'speech_start': setStatus('listening…', true); break;
    case 'speech_end':
      // The user's speech really ended at the last loud mic sample; arm the reply probe from there.
      state.armedSince = state.lastMicLoud;
      state.armedTurn = ev.turn;
      turnRow(ev.turn);
      setStatus('thinking…', true);
      break;
    case 'transcript':
      if (ev.final) {
        if (state.partialMsg) { state.partialMsg.remove(); state.partialMsg = null; }
        if (ev.text) addMsg('user', ev.text);
      } else {
        state.partialMsg ??= addMsg('user', '', 'partial');
        state.partialMsg.textContent = ev.text;
      }
      break;
    case 'reply_text':
      if (!state.botMsg || state.botMsg.dataset.turn !== String(ev.turn)) {
        state.botMsg = addMsg('bot', '');
        state.botMsg.dataset.turn = ev.turn;
      }
      state.botMsg.textContent = ev.text;
      break;
    case 'reply_audio_start': setStatus('speaking', true); break;
    case 'turn_metrics': { const t = turnRow(ev.turn); t.metrics = ev; renderBar(t); break; }
    case 'reply_done': setStatus('connected', true); break;
    case 'interrupted':
      if (state.botMsg) state.botMsg.classList.add('interrupted');
      state.armedSince = null;
      break;
    case 'error': showError(`${ev.stage || 'error'}: ${ev.message}`); break;
    case 'close': setStatus(`closed (${ev.reason})`); break;
  }
}

function onProbe(msg) {
  if (msg.kind === 'mic') { state.lastMicLoud = msg.t; return; }
  if (msg.kind === 'levels') { $('mic-level').value = Math.min(1, msg.mic * 3); $('bot-level').value = Math.min(1, msg.bot * 3); return; }
  if (msg.kind === 'bot' && state.armedSince != null && msg.t > state.armedSince) {
    const t = turnRow(state.armedTurn);
    if (t.v2v == null) {
      // The block's time is its start; the loud sample is inside it (≤ 2.7 ms at 48 kHz).
      t.v2v = (msg.t - state.armedSince) * 1000;
      renderBar(t);
    }
    state.armedSince = null;
  }
}

async function connect() {
  showError('');
  $('connect').disabled = true;
  setStatus('connecting…');
  try {
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 } });
    state.stream = stream;
    const ctx = new AudioContext({ latencyHint: 'interactive' });
    state.ctx = ctx;
    await ctx.audioWorklet.addModule('/static/level-worklet.js');
    const probe = new AudioWorkletNode(ctx, 'level-probe', { numberOfInputs: 2, numberOfOutputs: 0 });
    probe.port.onmessage = (e) => onProbe(e.data);
    state.probe = probe;
    ctx.createMediaStreamSource(stream).connect(probe, 0, 0);

    const pc = new RTCPeerConnection({ iceServers: [] });
    state.pc = pc;
    const channel = pc.createDataChannel('events');
    state.channel = channel;
    channel.onmessage = (e) => { try { onEvent(JSON.parse(e.data)); } catch (err) { console.error(err); } };
    for (const track of stream.getAudioTracks()) pc.addTrack(track, stream);
    pc.ontrack = (e) => {
      const remote = e.streams[0] || new MediaStream([e.track]);
      $('reply-audio').srcObject = remote;  // Chrome only feeds remote audio to Web Audio if it is also played
      ctx.createMediaStreamSource(remote).connect(probe, 0, 1);
    };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'connected') setStatus('connected', true);
      if (['failed', 'closed', 'disconnected'].includes(pc.connectionState)) setStatus(pc.connectionState);
      if (pc.connectionState === 'failed') showError('the connection failed');
    };
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise((resolve) => {  // gather host candidates into the offer (no trickle)
      if (pc.iceGatheringState === 'complete') return resolve();
      pc.addEventListener('icegatheringstatechange', () => pc.iceGatheringState === 'complete' && resolve());
      setTimeout(resolve, 2000);
    });
    const headers = { 'Content-Type': 'application/json' };
    const token = new URLSearchParams(location.search).get('token');
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch('/api/offer', { method: 'POST', headers,
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }) });
    const body = await res.json();
    if (!res.ok) throw new Error(body.detail || body.error || `offer failed (${res.status})`);
    state.sessionId = body.session_id;
    await pc.setRemoteDescription({ sdp: body.sdp, type: body.type });
    $('hangup').disabled = false;
  } catch (err) {
    showError(String(err.message || err));
    setStatus('idle');
    await hangup();
  }
}

async function hangup() {
  $('hangup').disabled = true;
  if (state.sessionId) {
    fetch(`/api/sessions/${state.sessionId}`, { method: 'DELETE' }).catch(() => {});
    state.sessionId = null;
  }
  state.pc?.close(); state.pc = null;
  state.stream?.getTracks().forEach((t) => t.stop()); state.stream = null;
  await state.ctx?.close().catch(() => {}); state.ctx = null;
  $('connect').disabled = false;
  if (!$('error').textContent) setStatus('idle');
}

async function legend() {
  try {
    const resp = await fetch('/api/stages');
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    STAGES = (await resp.json()).stages.map((s) => [s.name, s.color, s.label]);
  } catch (err) {
    console.warn('stage legend unavailable', err);
  }
  $('legend').innerHTML = STAGES.map(([, c, l]) => `<span><i style="background:${c}"></i>${l}</span>`).join('');
  for (const t of state.turns.values()) renderBar(t);
}

$('connect').addEventListener('click', connect);
$('hangup').addEventListener('click', hangup);
window.addEventListener('beforeunload', () => state.pc && hangup());
legend();
