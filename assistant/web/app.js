// Voice chat page: one WebRTC peer to the server, the `events` data channel, transcripts, and latency
// as this page hears it. Plain modern JS, no build step.

import { authHeaders } from './token.js';

let STAGES = [];  // [name, colour, label] of each server stage, from GET /api/stages (pipeline/trace.py)
let GAPS = [];  // [name, label] of each idle gap (turn_metrics gaps_ms), from the same answer

const $ = (id) => document.getElementById(id);
const state = { pc: null, channel: null, sessionId: null, ctx: null, stream: null, probe: null,
  micLoud: [], botLastLoud: null, armed: null, turns: new Map(), botMsg: null, partialMsg: null };
const MIC_HISTORY_S = 30;  // loud mic blocks remembered, to find where a turn's speech ended
const BOT_QUIET_S = 0.1;   // the reply's onset is a loud block after at least this much quiet
window.assistantState = state;  // for tests and curious users

function setStatus(text, live = false) { const s = $('status'); s.textContent = text; s.classList.toggle('live', live); }
function showError(text) { const e = $('error'); e.textContent = text; e.hidden = !text; }

function addMsg(who, text, cls = '', language = '') {
  const div = document.createElement('div');
  div.className = `msg ${who} ${cls}`.trim();
  div.textContent = text;
  if (language) tagLanguage(div, language);
  $('transcript').appendChild(div);
  $('transcript').scrollTop = $('transcript').scrollHeight;
  return div;
}

// Languages: each turn's, as the server heard it (transcript events), and the selector (the session event
// lists what the server hears; a change goes to the server on the events channel and holds from the next turn).
function tagLanguage(div, language, probability) {
  div.dataset.language = language;
  div.title = probability != null ? `${language} (p=${probability.toFixed(2)})` : language;
}

function fillLanguages(ev) {
  const select = $('language');
  const wanted = state.language || ev.language;
  select.innerHTML = '';
  for (const code of ev.languages || []) {
    const option = document.createElement('option');
    option.value = code;
    option.textContent = code;
    select.appendChild(option);
  }
  select.value = (ev.languages || []).includes(wanted) ? wanted : ev.language;
  state.language = select.value;
}

function chooseLanguage() {
  state.language = $('language').value;
  if (state.channel?.readyState === 'open' && state.language) {
    state.channel.send(JSON.stringify({ type: 'language', language: state.language }));
  }
}

// The browser's time zone, for the assistant's clock and alarms (the server checks it against the IANA names).
function sendTimeZone() {
  const timezone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  if (timezone && state.channel?.readyState === 'open') {
    state.channel.send(JSON.stringify({ type: 'timezone', timezone }));
  }
}

// This call's timers, reminders and alarms (timer events carry every one still running): each with the time it
// has left, counted down here from its due time.
function showTimers(timers) {
  state.timers = timers || [];
  clearInterval(state.timerTick);
  state.timerTick = state.timers.length ? setInterval(renderTimers, 1000) : null;
  renderTimers();
}

function renderTimers() {
  const list = $('timers');
  list.innerHTML = '';
  for (const t of state.timers || []) {
    const left = Math.max(0, Math.round((t.due_ms - Date.now()) / 1000));
    const li = document.createElement('li');
    li.dataset.id = t.id;
    li.textContent = `${t.kind}: ${t.label} — ${Math.floor(left / 60)}:${String(left % 60).padStart(2, '0')}`;
    list.appendChild(li);
  }
  list.hidden = !list.children.length;
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
  const g = t.metrics?.gaps_ms || {};
  const gaps = GAPS.filter(([name]) => name in g).map(([name, label]) => `${label}: ${g[name].toFixed(0)} ms`);
  t.tr.title = gaps.join('\n');
  t.tr.querySelector('.server').textContent = d.server_v2v_ms != null ? `${d.server_v2v_ms.toFixed(0)} ms` : '…';
  t.tr.querySelector('.v2v').textContent = t.v2v != null ? `${t.v2v.toFixed(0)} ms` : '…';
}

function onEvent(ev) {
  switch (ev.type) {
    case 'session': state.sessionId = ev.session_id; fillLanguages(ev); break;
    case 'responder_fallback': showError(`the model is down; ${ev.reason}`); break;
    case 'responder': showResponder(ev); break;  // a better model answers from now on (respond.model_path = auto)
    case 'timer': showTimers(ev.timers); break;
    case 'voice_fallback': showError(`no voice speaks ${ev.language}: the ${ev.engine} default voice reads it`); break;
    case 'speech_start': setStatus('listening…', true); break;
    case 'speech_end':
      // The server says how long ago (its clock) the speech ended; the same moment on this page's clock is
      // the last loud mic block before (now − ago). Taking simply the last loud block would pick up speech
      // that went on after the server's end (a pause taken for the end, the next utterance) and show less
      // than the server: an impossible figure.
      if (state.ctx) {
        state.armed = { turn: ev.turn, cutoff: state.ctx.currentTime - (ev.ago_ms ?? 0) / 1000 };
      }
      turnRow(ev.turn);
      setStatus('thinking…', true);
      break;
    case 'transcript':
      if (ev.final) {
        if (state.partialMsg) { state.partialMsg.remove(); state.partialMsg = null; }
        if (ev.text) {
          const msg = addMsg('user', ev.text);
          msg.dataset.turn = ev.turn;
          tagLanguage(msg, ev.language || '', ev.language_probability);
        }
        if (ev.language) state.turnLanguage = ev.language;
      } else {
        state.partialMsg ??= addMsg('user', '', 'partial');
        state.partialMsg.textContent = ev.text;
      }
      break;
    case 'reply_text':
      if (!state.botMsg || state.botMsg.dataset.turn !== String(ev.turn)) {
        state.botMsg = addMsg('bot', '', '', state.turnLanguage || '');
        state.botMsg.dataset.turn = ev.turn;
      }
      state.botMsg.textContent = ev.text;
      break;
    case 'reply_audio_start': setStatus('speaking', true); break;
    case 'reply_resumed':  // the sound over the reply was a backchannel: not a turn, the reply goes on
      state.armed = null;
      if (state.botMsg) state.botMsg.classList.remove('interrupted');
      setStatus('speaking', true);
      break;
    case 'turn_metrics': { const t = turnRow(ev.turn); t.metrics = ev; renderBar(t); break; }
    case 'reply_done': setStatus('connected', true); break;
    case 'interrupted':
      if (state.botMsg) state.botMsg.classList.add('interrupted');
      break;
    case 'turn_dropped': {
      // The user was not done: the turn's words come again, whole, in the next turn. A reply already heard
      // stays (marked interrupted, its latency measured); the words shown twice do not, nor a turn nobody heard.
      for (const msg of $('transcript').querySelectorAll(`.msg.user[data-turn="${ev.turn}"]`)) msg.remove();
      const t = state.turns.get(ev.turn);
      if (!ev.heard && t) { t.tr.remove(); state.turns.delete(ev.turn); }
      if (!ev.heard && state.armed?.turn === ev.turn) state.armed = null;
      break;
    }
    case 'error': showError(`${ev.stage || 'error'}: ${ev.message}`); break;
    case 'close': setStatus(`closed (${ev.reason})`); break;
  }
}

function micEndBefore(cutoff) {
  // The last loud mic block at or before `cutoff` (AudioContext seconds), or null.
  const loud = state.micLoud;
  for (let i = loud.length - 1; i >= 0; i--) if (loud[i] <= cutoff) return loud[i];
  return null;
}

function onProbe(msg) {
  if (msg.kind === 'mic') {
    state.micLoud.push(msg.t);
    while (state.micLoud.length && state.micLoud[0] < msg.t - MIC_HISTORY_S) state.micLoud.shift();
    return;
  }
  if (msg.kind === 'levels') { $('mic-level').value = Math.min(1, msg.mic * 3); $('bot-level').value = Math.min(1, msg.bot * 3); return; }
  if (msg.kind !== 'bot') return;
  const quietBefore = state.botLastLoud == null || msg.t - state.botLastLoud > BOT_QUIET_S;
  state.botLastLoud = msg.t;
  const armed = state.armed;
  if (!armed) return;
  // The reply's onset: the first loud block after the speech end that follows quiet. The tail of an
  // earlier reply still sounding when the turn ended is not this turn's reply.
  if (!quietBefore) return;
  state.armed = null;
  const micEnd = micEndBefore(armed.cutoff);
  const t = turnRow(armed.turn);
  if (t.v2v == null && micEnd != null) {
    // Mic blocks are stamped at their start (the loud sample is at or after it), bot blocks too (the loud
    // sample is within 2.7 ms after): the figure errs long, never short.
    t.v2v = (msg.t - micEnd) * 1000;
    renderBar(t);
  }
}

const params = new URLSearchParams(location.search);

async function apiError(res, what) {
  const body = await res.json().catch(() => ({}));
  return new Error(`${what}: ${body.detail || body.error || `HTTP ${res.status}`}`);
}

// Trickle ICE: candidates go to the session resource (PATCH, RFC 8840 fragment) as they come. Those found
// before the answer names the session wait in `pending`; one PATCH at a time keeps them in order.
function iceCredentials(sdp) {
  return { ufrag: /a=ice-ufrag:(\S+)/.exec(sdp)?.[1], pwd: /a=ice-pwd:(\S+)/.exec(sdp)?.[1] };
}

function sdpFragment(pc, candidates, end) {
  const { ufrag, pwd } = iceCredentials(pc.localDescription.sdp);
  const lines = [`a=ice-ufrag:${ufrag}`, `a=ice-pwd:${pwd}`];
  const byMid = new Map();
  for (const c of candidates) {
    const mid = c.sdpMid ?? String(c.sdpMLineIndex ?? 0);
    if (!byMid.has(mid)) byMid.set(mid, []);
    byMid.get(mid).push(c.candidate);
  }
  if (!byMid.size) byMid.set(pc.getTransceivers()[0]?.mid ?? '0', []);
  for (const [mid, cands] of byMid) {
    lines.push('m=audio 9 UDP/TLS/RTP/SAVPF 0', `a=mid:${mid}`, ...cands.map((c) => `a=${c}`));
  }
  if (end) lines.push('a=end-of-candidates');
  return lines.join('\r\n') + '\r\n';
}

function flushCandidates() {
  const t = state.trickle;
  if (!t || !t.url || !t.pending.length || !state.pc) return;
  const batch = t.pending.splice(0);
  const end = batch.includes(null);
  const cands = batch.filter((c) => c && c.candidate);
  const body = sdpFragment(state.pc, cands, end);
  t.chain = t.chain.then(async () => {
    const res = await fetch(t.url, { method: 'PATCH', body,
      headers: authHeaders({ 'Content-Type': 'application/trickle-ice-sdpfrag', 'If-Match': t.etag || '*' }) });
    if (!res.ok && res.status !== 404) console.warn('trickle refused', res.status, await res.text());
  }).catch((err) => console.warn('trickle failed', err));
}

function relayFailure() {
  if (state.iceAuthError) return state.iceAuthError;
  const why = state.iceErrors.length ? state.iceErrors.join('; ') : 'no TURN server answered';
  return `no relay path: the TURN server gave no relay address (${why}). Check ice.turn_urls and that the ` +
    'TURN server is reachable.';
}

async function connect() {
  showError('');
  $('connect').disabled = true;
  setStatus('connecting…');
  state.iceErrors = [];
  state.iceAuthError = '';
  state.connectTimes = {};
  try {
    const iceRes = await fetch('/api/ice', { headers: authHeaders() });
    if (!iceRes.ok) throw await apiError(iceRes, 'ICE configuration');
    const ice = await iceRes.json();
    const trickle = params.has('trickle') ? params.get('trickle') !== '0' : ice.trickle !== false;
    const relayOnly = ice.iceTransportPolicy === 'relay';

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

    const pc = new RTCPeerConnection({ iceServers: ice.iceServers || [], iceTransportPolicy: ice.iceTransportPolicy || 'all' });
    state.pc = pc;
    state.trickle = trickle ? { url: null, etag: null, pending: [], chain: Promise.resolve() } : null;
    let relayCandidates = 0;
    pc.onicecandidate = (e) => {
      if (e.candidate && / typ relay /.test(e.candidate.candidate)) relayCandidates += 1;
      if (!e.candidate && relayOnly && !relayCandidates) { showError(relayFailure()); hangup(); return; }
      if (state.trickle) { state.trickle.pending.push(e.candidate); flushCandidates(); }
    };
    pc.onicecandidateerror = (e) => {
      state.iceErrors.push(`${e.url || e.address || 'ICE server'}: ${e.errorCode} ${e.errorText}`.trim());
      if (e.errorCode === 401) {
        state.iceAuthError = `the TURN server ${e.url} refused the credentials (401 ${e.errorText || 'Unauthorized'}):` +
          ' wrong or expired TURN credential. Check that ice.turn_secret equals the TURN server\'s' +
          ' static-auth-secret (or the static username/credential) and that both clocks are right.';
        showError(state.iceAuthError);
      }
    };
    const channel = pc.createDataChannel('events');
    state.channel = channel;
    channel.onmessage = (e) => { try { onEvent(JSON.parse(e.data)); } catch (err) { console.error(err); } };
    channel.addEventListener('open', sendTimeZone);
    for (const track of stream.getAudioTracks()) pc.addTrack(track, stream);
    pc.ontrack = (e) => {
      const remote = e.streams[0] || new MediaStream([e.track]);
      $('reply-audio').srcObject = remote;  // Chrome only feeds remote audio to Web Audio if it is also played
      ctx.createMediaStreamSource(remote).connect(probe, 0, 1);
      // unmute = the first RTP packet arrived: the connect time this page reports (offer → first audio packet).
      e.track.addEventListener('unmute', () => {
        if (state.connectTimes.firstPacket != null) return;
        state.connectTimes.firstPacket = performance.now();
        state.connectMs = state.connectTimes.firstPacket - state.connectTimes.offer;
      }, { once: true });
    };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'connected') setStatus('connected', true);
      if (['failed', 'closed', 'disconnected'].includes(pc.connectionState)) setStatus(pc.connectionState);
      if (pc.connectionState === 'failed') {
        showError(relayOnly && !relayCandidates ? relayFailure() : 'the connection failed (no ICE path to the server)');
      }
    };
    state.connectTimes.offer = performance.now();
    await pc.setLocalDescription(await pc.createOffer());
    if (!trickle) {
      await new Promise((resolve) => {  // gather candidates into the offer (no trickle), 2 s at most
        if (pc.iceGatheringState === 'complete') return resolve();
        pc.addEventListener('icegatheringstatechange', () => pc.iceGatheringState === 'complete' && resolve());
        setTimeout(resolve, 2000);
      });
      if (!state.pc) return;  // the relay check above already gave up
    }
    const res = await fetch('/api/offer', { method: 'POST', headers: authHeaders({ 'Content-Type': 'application/json' }),
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type,
        ...(state.language ? { language: state.language } : {}) }) });
    if (!res.ok) throw await apiError(res, 'offer refused');
    const body = await res.json();
    state.connectTimes.answer = performance.now();
    if (state.pc !== pc) {  // hung up meanwhile (ICE error): end the session the server just opened
      await fetch(`/api/sessions/${body.session_id}`, { method: 'DELETE', headers: authHeaders() }).catch(() => {});
      return;
    }
    state.sessionId = body.session_id;
    showResponder(body.responder);
    await pc.setRemoteDescription({ sdp: body.sdp, type: body.type });
    if (state.trickle) {
      state.trickle.url = `/api/sessions/${body.session_id}`;
      state.trickle.etag = body.etag || null;
      flushCandidates();
    }
    $('hangup').disabled = false;
  } catch (err) {
    showError(String(err.message || err));
    setStatus('idle');
    await hangup();
  }
}

function showResponder(who) {  // the offer's answer names who answers: {engine, model, why}
  const el = $('responder');
  // An engine down (its child process restarting, or failed for good) says so, and why.
  const down = who && who.state ? `${who.state}${who.reason ? `: ${who.reason}` : ''}` : '';
  el.textContent = who ? [who.engine, who.model, down].filter(Boolean).join(' · ') : '';
  el.title = who && who.why ? `who answers: ${who.why}` : 'who answers: responder · model';
  el.hidden = !el.textContent;
}

async function hangup() {
  $('hangup').disabled = true;
  const id = state.sessionId;
  state.sessionId = null;
  state.trickle = null;
  if (id) {
    // keepalive: the DELETE still goes out when the page is being closed.
    try {
      const res = await fetch(`/api/sessions/${id}`, { method: 'DELETE', headers: authHeaders(), keepalive: true });
      state.hangupStatus = res.status;
      if (!res.ok && res.status !== 404) showError((await apiError(res, 'hang-up refused')).message);
    } catch (err) {
      state.hangupStatus = 0;
    }
  }
  showTimers([]);  // a call that ends cancels its timers
  state.pc?.close(); state.pc = null;
  state.stream?.getTracks().forEach((t) => t.stop()); state.stream = null;
  await state.ctx?.close().catch(() => {}); state.ctx = null;
  $('connect').disabled = false;
  if (!$('error').textContent) setStatus('idle');
}

async function legend() {
  try {
    const resp = await fetch('/api/stages', { headers: authHeaders() });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const body = await resp.json();
    STAGES = body.stages.map((s) => [s.name, s.color, s.label]);
    GAPS = (body.gaps || []).map((g) => [g.name, g.label]);
  } catch (err) {
    console.warn('stage legend unavailable', err);
  }
  $('legend').innerHTML = STAGES.map(([, c, l]) => `<span><i style="background:${c}"></i>${l}</span>`).join('');
  for (const t of state.turns.values()) renderBar(t);
}

$('connect').addEventListener('click', connect);
$('hangup').addEventListener('click', hangup);
$('language').addEventListener('change', chooseLanguage);
window.addEventListener('beforeunload', () => state.pc && hangup());
legend();
